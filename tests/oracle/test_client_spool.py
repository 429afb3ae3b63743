"""The spool's handling of events the service refuses only for now (``"later"``): kept in a
segment of their own, not sent again before it is due, set aside when dated too far ahead.
A counting ``send`` stands in for the service (the live case is in
tests/dashboard/test_client.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from turnout.oracle import client_spool
from turnout.oracle.client_spool import Spool


def _event(i: int, ahead: dt.timedelta) -> dict[str, Any]:
    return {"event_id": f"e{i}", "at": (dt.datetime.now(dt.UTC) + ahead).isoformat()}


def test_events_refused_for_now_are_kept_and_not_resent_before_due(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(5):
        spool.append(_event(i, dt.timedelta(minutes=10)))
    spool.append(_event(9, dt.timedelta(days=400)))  # no clock fix brings it in
    calls: list[int] = []

    def later(batch: list[dict[str, Any]]) -> client_spool.SendResult:
        calls.append(len(batch))
        return "later"

    assert spool.drain(later, batch_size=100) == 0
    assert calls == [6, 1, 1, 1, 1, 1, 1]  # the batch, then each event alone
    assert spool.pending() == 5
    [aside] = tmp_path.glob("rejected-*.jsonl")
    assert '"e9"' in aside.read_text()
    calls.clear()
    assert spool.drain(later, batch_size=100) == 0
    assert calls == []  # not due again yet: no request
    [segment] = tmp_path.glob("sealed-*-deferred-*.jsonl")
    due = float(segment.stem.rsplit("-deferred-", 1)[1])
    assert 0 < due - dt.datetime.now(dt.UTC).timestamp() <= client_spool.DEFER_RETRY_S
    segment.rename(segment.with_name(segment.name.rsplit("-deferred-", 1)[0] + "-deferred-0.jsonl"))
    assert spool.drain(lambda batch: "ok", batch_size=100) == 5  # due: sent, taken
    assert spool.pending() == 0
