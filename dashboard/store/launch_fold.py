"""Migration 0007's clean-up: the follow-up events (``<id>.startup``, vLLM's start-up line) that a
service before it stored as decisions of their own are folded into the decision they follow.

A service at migration 0006 dropped an event's ``launch`` part, so a follow-up is known by its
id and its content alone: ``X.startup`` beside a stored ``X`` of the same deployment and the
same decision (pack, family, stage, runner, mode, reason code). Each such row is deleted and
taken off the day counts (``daily_decisions``); a deployment whose latest decision it was gets
its latest remaining event back (``deployments``; the config it holds stays: the events table
keeps none, and the folded row reported the config of the same deployment's start), and
``latest_counts`` is rebuilt from ``deployments`` when one did. vLLM's line itself is not in
the store any more, so the decisions get no ``startup``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, delete, select, update

from turnout.dashboard.store import latest_counts
from turnout.dashboard.store.launches import FOLLOW_UP_SUFFIX
from turnout.dashboard.store.models import DailyDecisions, DecisionEvent, Deployment

_CHUNK = 500
_SAME = ("deployment_id", "pack", "family", "stage", "runner", "mode", "reason_code", "demo")
_LATEST = (
    "event_id",
    "at",
    "host",
    "pack",
    "family",
    "runner",
    "mode",
    "stage",
    "reason_code",
    "rule_ids",
    "demo",
)


def _events() -> Any:
    return DecisionEvent.__table__.c


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _rows(conn: Connection, column: str, values: Sequence[str]) -> list[Any]:
    """Events (the columns a fold reads) whose ``column`` is one of ``values``."""
    e = _events()
    cols = [e[c] for c in ("event_id", "at", "deployment_id", *_LATEST[2:])]
    out: list[Any] = []
    for chunk in _chunks(values):
        out += conn.execute(select(*cols).where(e[column].in_(chunk))).all()
    return out


def fold_follow_ups(conn: Connection, now: dt.datetime | None = None) -> int:
    """Fold every stored follow-up event into its decision (see the module's docstring), in
    the caller's transaction; returns how many rows were folded."""
    e = _events()
    found = (
        conn.execute(select(e.event_id).where(e.event_id.like(f"%{FOLLOW_UP_SUFFIX}")))
        .scalars()
        .all()
    )
    ids = sorted(i for i in found if i.endswith(FOLLOW_UP_SUFFIX))  # LIKE ignores case
    if not ids:
        return 0
    follow_ups = _rows(conn, "event_id", ids)
    bases = {
        r.event_id: r for r in _rows(conn, "event_id", [i[: -len(FOLLOW_UP_SUFFIX)] for i in ids])
    }
    folded = [f for f in follow_ups if _same(f, bases.get(f.event_id[: -len(FOLLOW_UP_SUFFIX)]))]
    if not folded:
        return 0
    gone = sorted(f.event_id for f in folded)
    for chunk in _chunks(gone):
        conn.execute(delete(DecisionEvent).where(e.event_id.in_(chunk)))
    _uncount_daily(conn, folded)
    if _repoint(conn, set(gone)):
        latest_counts.rebuild(conn, now)
    return len(folded)


def _same(follow_up: Any, base: Any | None) -> bool:
    return base is not None and all(getattr(follow_up, c) == getattr(base, c) for c in _SAME)


def _uncount_daily(conn: Connection, folded: Sequence[Any]) -> None:
    """Take the folded rows off ``daily_decisions`` (a row down to zero goes)."""
    d = DailyDecisions.__table__.c
    keys = Counter(
        (f.at.astimezone(dt.UTC).date(), f.family, f.runner or "", f.reason_code, bool(f.demo))
        for f in folded
    )
    for (day, family, runner, code, demo), n in sorted(keys.items()):
        conn.execute(
            update(DailyDecisions)
            .where(
                d.day == day,
                d.family == family,
                d.runner == runner,
                d.reason_code == code,
                d.demo == demo,
            )
            .values(num_events=d.num_events - n)
        )
    conn.execute(delete(DailyDecisions).where(d.num_events <= 0))


def _repoint(conn: Connection, gone: set[str]) -> int:
    """Deployments whose latest decision was a folded row: their latest remaining event
    (greatest ``(at, event_id)``) becomes their latest decision; returns how many moved."""
    dep = Deployment.__table__.c
    moved: list[str] = []
    for chunk in _chunks(sorted(gone)):
        moved += (
            conn.execute(select(dep.deployment_id).where(dep.event_id.in_(chunk))).scalars().all()
        )
    latest: dict[str, Any] = {}
    for r in _rows(conn, "deployment_id", sorted(moved)):
        cur = latest.get(r.deployment_id)
        if cur is None or (r.at, r.event_id) > (cur.at, cur.event_id):
            latest[r.deployment_id] = r
    for deployment_id, r in sorted(latest.items()):
        conn.execute(
            update(Deployment)
            .where(dep.deployment_id == deployment_id)
            .values({c: getattr(r, c) for c in _LATEST})
        )
    return len(latest)
