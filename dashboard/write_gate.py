"""Control writes before ingest: the kill switch and flips wait for at most one ingest
transaction.

SQLite has one writer at a time, and a writer that finds the database locked sleeps and tries
again (``busy_timeout``): while engines post batches of 5,000 events back to back, each
batch's transaction takes the lock as the last one releases it, and an operator's kill switch,
asleep between its tries, lost the race for 17 s (one ``database is locked`` 500 after that).
In this process, a control write now announces itself here first; ingest transactions that
have not started wait until no control write is waiting (at most ``MAX_INGEST_WAIT_S``, so that
a stream of control writes cannot stop ingest for good), so the control write waits for the
one transaction under way, not for the queue. On PostgreSQL rows are locked, not the database:
the gate costs a lock and a counter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The longest an ingest transaction waits for control writes to pass, seconds.
MAX_INGEST_WAIT_S = 5.0


class WriteGate:
    """One per process (``Services.write_gate``); thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting_control = 0

    @contextmanager
    def control(self) -> Iterator[None]:
        """Around a control write's transaction: ingest transactions not yet started wait."""
        with self._cond:
            self._waiting_control += 1
        try:
            yield
        finally:
            with self._cond:
                self._waiting_control -= 1
                self._cond.notify_all()

    @contextmanager
    def ingest(self) -> Iterator[None]:
        """Before an ingest transaction: wait while a control write waits (bounded)."""
        with self._cond:
            self._cond.wait_for(lambda: self._waiting_control == 0, timeout=MAX_INGEST_WAIT_S)
        yield

    def waiting_control(self) -> int:
        with self._cond:
            return self._waiting_control
