"""Decision-event ingest (batched, idempotent by ``event_id``) and the roll-ups kept with it.

One transaction per batch stores the new events, moves each deployment's latest decision
forward (``deployments``) with its counts (``latest_counts``, see
``dashboard/store/latest_counts.py``) and adds to the daily roll-up, so the pages read small
tables even with millions of events. Duplicates (a client resending after a lost
acknowledgement) are skipped before anything is counted. A follow-up event that carries vLLM's
start-up line (``<id>.startup``) is no decision of its own: its line is attached to the
decision's row (``dashboard/store/launches.py``). The writes themselves are in
``ingest_sqlite.py`` and ``ingest_pg.py``, one per backend.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from turnout.dashboard.store import latest_counts, launches
from turnout.dashboard.store.models import (
    DailyDecisions,
    DecisionEvent,
    Deployment,
    LatestCounts,
)
from turnout.oracle.wire import LaunchIn


class EventLike(Protocol):
    """What ingest reads from an event (EventRecord, or the API's validated EventIn as is)."""

    @property
    def event_id(self) -> str: ...
    @property
    def at(self) -> dt.datetime: ...
    @property
    def deployment_id(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def pack(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def runner(self) -> str | None: ...
    @property
    def mode(self) -> str: ...
    @property
    def stage(self) -> str | None: ...
    @property
    def reason_code(self) -> str: ...
    @property
    def rule_ids(self) -> Sequence[str]: ...
    @property
    def policy_digest(self) -> str: ...
    @property
    def config(self) -> dict[str, Any] | None: ...
    @property
    def demo(self) -> bool: ...
    @property
    def launch(self) -> LaunchIn | None: ...


@dataclass(frozen=True)
class EventRecord:
    """One reported decision (the API's validated input)."""

    event_id: str
    at: dt.datetime
    deployment_id: str
    pack: str
    family: str
    runner: str | None
    mode: str
    reason_code: str
    host: str = ""
    stage: str | None = None
    rule_ids: tuple[str, ...] = ()
    policy_digest: str = ""
    config: dict[str, Any] | None = field(default=None, compare=False)
    demo: bool = False
    launch: LaunchIn | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Ingested:
    """What a batch stored: ``inserted`` new decisions; ``attached``: vLLM start-up lines
    attached to their decisions by this batch (not before)."""

    inserted: int
    attached: list[launches.Attached] = field(default_factory=list)


def ingest(*, session: Session, events: Sequence[EventLike], now: dt.datetime | None = None) -> int:
    """Store a batch in the caller's transaction; returns how many decisions were new (not
    duplicates, not follow-ups that carry a start-up line to a stored decision).

    ``now``: the time the fine buckets of ``latest_counts`` are kept from (default: the
    clock). The caller acknowledges only after commit: an acknowledged event is durable.
    """
    return ingest_batch(session=session, events=events, now=now).inserted


def ingest_batch(
    *, session: Session, events: Sequence[EventLike], now: dt.datetime | None = None
) -> Ingested:
    """:func:`ingest`, saying which start-up lines it attached."""
    decisions, lines = launches.split(events)
    first: dict[str, EventLike] = {}
    for e in decisions:  # a batch may repeat an event: the first copy counts, as across batches
        first.setdefault(e.event_id, e)
    unique = list(first.values())
    if not unique:
        return Ingested(0)
    now = now or dt.datetime.now(dt.UTC)
    if session.get_bind().dialect.name == "sqlite":
        from turnout.dashboard.store.ingest_sqlite import ingest_sqlite

        inserted = ingest_sqlite(session, unique, now)
    else:
        from turnout.dashboard.store.ingest_pg import insert_events_pg

        ids = insert_events_pg(session.connection(), unique)
        fresh = [e for e in unique if e.event_id in ids]
        if fresh:
            advance_deployments(session, fresh, now)
            add_daily(session, fresh)
        inserted = len(fresh)
    attached = launches.attach(session.connection(), lines) if lines else []
    latest_counts.prune_hourly(session.connection(), now)  # last: see its docstring
    return Ingested(inserted, attached)


def latest_per_deployment(
    events: Iterable[EventLike], into: dict[str, EventLike] | None = None
) -> dict[str, EventLike]:
    """Deployment id → its latest event: the greatest ``(at, event_id)`` (ties of time are
    broken by event id, the same order the stored rows are compared in)."""
    latest = {} if into is None else into
    for e in events:
        cur = latest.get(e.deployment_id)
        if cur is None or (e.at, e.event_id) > (cur.at, cur.event_id):
            latest[e.deployment_id] = e
    return latest


def advance_deployments(session: Session, events: Sequence[EventLike], now: dt.datetime) -> None:
    """Move each deployment's latest decision forward to the newest of ``events`` where it is
    newer than the stored one (out-of-order delivery never moves it back), and its counts in
    ``latest_counts`` with it."""
    latest = list(latest_per_deployment(events).values())
    if session.get_bind().dialect.name == "sqlite":
        from turnout.dashboard.store.ingest_sqlite import advance_sqlite

        advance_sqlite(session.connection(), latest, now)
        return
    from turnout.dashboard.store.ingest_pg import advance_pg

    advance_pg(session.connection(), latest, now)


DailyKey = tuple[dt.date, str, str, str, bool]


def daily_counts(
    events: Iterable[EventLike], into: Counter[DailyKey] | None = None
) -> Counter[DailyKey]:
    """Events per (UTC day, family, runner, reason code, demo): the daily roll-up's
    increments."""
    decisions = into if into is not None else Counter()
    get = decisions.get  # a plain update: Counter's += costs twice as much
    for e in events:
        k = (e.at.astimezone(dt.UTC).date(), e.family, e.runner or "", e.reason_code, e.demo)
        decisions[k] = get(k, 0) + 1
    return decisions


def add_daily(session: Session, events: Iterable[EventLike]) -> None:
    write_daily(session, daily_counts(events))


def write_daily(session: Session, decisions: Counter[DailyKey]) -> None:
    """Add to the daily roll-up (an upsert per key, in key order)."""
    if session.get_bind().dialect.name == "sqlite":
        from turnout.dashboard.store.ingest_sqlite import write_daily_sqlite

        write_daily_sqlite(session.connection(), decisions)
        return
    from turnout.dashboard.store.ingest_pg import write_daily_pg

    write_daily_pg(session.connection(), decisions)


def count_events(*, session: Session, demo: bool | None = None) -> int:
    from sqlalchemy import func

    stmt = select(func.count()).select_from(DecisionEvent)
    if demo is not None:
        stmt = stmt.where(DecisionEvent.demo.is_(demo))
    return int(session.scalar(stmt) or 0)


def remove_demo(*, session: Session) -> int:
    """Delete every demo event, deployment and roll-up row; returns the events removed."""
    num = count_events(session=session, demo=True)
    for table in (DecisionEvent, Deployment, DailyDecisions, LatestCounts):
        session.execute(delete(table).where(table.demo.is_(True)))
    return num


def list_events(
    *,
    session: Session,
    limit: int = 100,
    family: str | None = None,
    runner: str | None = None,
    reason_code: str | None = None,
    rule_id: str | None = None,
    deployment_id: str | None = None,
) -> list[DecisionEvent]:
    """Newest first, filtered; ``runner="none"`` selects decisions without a runner (errors)."""
    stmt = (
        select(DecisionEvent).order_by(DecisionEvent.at.desc(), DecisionEvent.event_id).limit(limit)
    )
    if family:
        stmt = stmt.where(DecisionEvent.family == family)
    if runner == "none":
        stmt = stmt.where(DecisionEvent.runner.is_(None))
    elif runner:
        stmt = stmt.where(DecisionEvent.runner == runner)
    if reason_code:
        stmt = stmt.where(DecisionEvent.reason_code == reason_code)
    if deployment_id:
        stmt = stmt.where(DecisionEvent.deployment_id == deployment_id)
    if rule_id:
        # A ranking key: a rule id, "rule:stage" for per-stage rollout reasons, or a reason code.
        rule, _, stage = rule_id.partition(":")
        if stage:
            stmt = stmt.where(DecisionEvent.stage == stage)
        scan = session.scalars(stmt.limit(limit * 50))
        return [
            e for e in scan if rule in e.rule_ids or (not e.rule_ids and e.reason_code == rule)
        ][:limit]
    return list(session.scalars(stmt))
