"""The write gate (dashboard/write_gate.py): an ingest transaction not yet started waits while a
control write (kill switch, flip) waits, so the control write goes next; ingest never waits
longer than the bound. Ordering is checked with events, not timings."""

from __future__ import annotations

import threading

from turnout.dashboard import write_gate
from turnout.dashboard.write_gate import WriteGate


def test_ingest_waits_while_a_control_write_waits() -> None:
    gate = WriteGate()
    order: list[str] = []
    control_waiting = threading.Event()
    release_control = threading.Event()

    def control() -> None:
        with gate.control():
            control_waiting.set()
            release_control.wait(10)
            order.append("control")

    def ingest() -> None:
        with gate.ingest():
            order.append("ingest")

    c = threading.Thread(target=control)
    c.start()
    control_waiting.wait(10)
    i = threading.Thread(target=ingest)
    i.start()
    i.join(0.3)
    assert i.is_alive() and order == []  # held at the gate
    release_control.set()
    c.join(10)
    i.join(10)
    assert order == ["control", "ingest"] and gate.waiting_control() == 0


def test_ingest_is_not_held_for_good(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(write_gate, "MAX_INGEST_WAIT_S", 0.05)
    gate = WriteGate()
    with gate.control():  # a control write that never ends
        done = threading.Event()

        def ingest() -> None:
            with gate.ingest():
                done.set()

        t = threading.Thread(target=ingest)
        t.start()
        assert done.wait(10)  # let through after the bound
        t.join(10)
