"""Decision-event ingest (batched, idempotent by ``event_id``) and the roll-ups kept with it.

One transaction per batch stores the new events, moves each deployment's latest decision
forward (``deployments``) with its counts (``latest_counts``, see
``dashboard/store/latest_counts.py``) and adds to the daily roll-ups, so the pages read small
tables even with millions of events. Duplicates (a client resending after a lost acknowledgement) are
skipped before anything is counted.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import delete, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from dashboard.store import latest_counts
from dashboard.store.latest_counts import State, reason_keys, state_of
from dashboard.store.models import (
    DailyDecisions,
    DailyReasons,
    DecisionEvent,
    Deployment,
    LatestCounts,
)


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


def _insert(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def ingest(*, session: Session, events: Sequence[EventLike],
           now: dt.datetime | None = None) -> int:
    """Store a batch in the caller's transaction; returns how many were new (not duplicates).

    ``now``: the time the fine buckets of ``latest_counts`` are kept from (default: the
    clock). The caller acknowledges only after commit: an acknowledged event is durable.
    """
    first: dict[str, EventLike] = {}
    for e in events:  # a batch may repeat an event: the first copy counts, as across batches
        first.setdefault(e.event_id, e)
    events = list(first.values())
    if not events:
        return 0
    now = now or dt.datetime.now(dt.UTC)
    if session.get_bind().dialect.name == "sqlite":
        from dashboard.store.ingest_sqlite import ingest_sqlite

        return ingest_sqlite(session, events, now)
    # In event id order: two batches that share events wait on each other in one order.
    rows = sorted((_event_row(e) for e in events), key=lambda r: str(r["event_id"]))
    # Core tables, not the ORM classes: the ORM's bulk-insert bookkeeping costs more than the
    # insert itself at these batch sizes.
    table = DecisionEvent.__table__
    stmt = _insert(session, table).on_conflict_do_nothing(index_elements=["event_id"])
    inserted = set(session.scalars(stmt.returning(table.c.event_id), rows))
    fresh = [e for e in events if e.event_id in inserted]
    if fresh:
        advance_deployments(session, fresh, now)
        add_daily(session, fresh)
    return len(fresh)


def _event_row(e: EventLike) -> dict[str, Any]:
    return {
        "event_id": e.event_id, "at": e.at, "deployment_id": e.deployment_id, "host": e.host,
        "pack": e.pack, "family": e.family, "runner": e.runner, "mode": e.mode,
        "stage": e.stage, "reason_code": e.reason_code, "rule_ids": list(e.rule_ids),
        "policy_digest": e.policy_digest, "demo": e.demo,
    }


def latest_per_deployment(events: Iterable[EventLike],
                          into: dict[str, EventLike] | None = None) -> dict[str, EventLike]:
    """Deployment id → its latest event: the greatest ``(at, event_id)`` (ties of time are
    broken by event id, the same order the stored rows are compared in)."""
    latest = {} if into is None else into
    for e in events:
        cur = latest.get(e.deployment_id)
        if cur is None or (e.at, e.event_id) > (cur.at, cur.event_id):
            latest[e.deployment_id] = e
    return latest


def advance_deployments(session: Session, events: Sequence[EventLike],
                        now: dt.datetime) -> None:
    """Move each deployment's latest decision forward to the newest of ``events`` where it is
    newer than the stored one (out-of-order delivery never moves it back), and its counts in
    ``latest_counts`` with it."""
    if session.get_bind().dialect.name == "sqlite":
        from dashboard.store.ingest_sqlite import advance_sqlite

        advance_sqlite(session.connection(), list(latest_per_deployment(events).values()), now)
        return
    latest = latest_per_deployment(events)
    ids = sorted(latest)  # one lock order for every transaction
    rows = [_deployment_row(latest[d]) for d in ids]
    table: Any = Deployment.__table__  # Core: no ORM bulk bookkeeping
    # New deployments first: inserted here, or waited for when another ingest inserts the
    # same id (it then counts as existing, read below under a row lock).
    new = set(session.scalars(
        postgresql.insert(table).on_conflict_do_nothing(index_elements=["deployment_id"])
        .returning(table.c.deployment_id), rows))
    existing = [d for d in ids if d not in new]
    c = table.c
    old = {r.deployment_id: state_of(r) for r in session.execute(
        select(c.deployment_id, c.at, c.event_id, c.pack, c.family, c.stage, c.runner,
               c.reason_code, c.rule_ids, c.demo)
        .where(c.deployment_id.in_(existing)).order_by(c.deployment_id).with_for_update())
    } if existing else {}
    newer = [d for d in existing if d not in old
             or (latest[d].at, latest[d].event_id) > (old[d].at, old[d].event_id)]
    if newer:
        stmt = postgresql.insert(table)
        excluded = stmt.excluded
        names = [n for n in rows[0] if n != "deployment_id"]
        session.execute(stmt.on_conflict_do_update(
            index_elements=["deployment_id"], set_={n: excluded[n] for n in names},
            where=tuple_(c.at, c.event_id) < tuple_(excluded.at, excluded.event_id)),
            [_deployment_row(latest[d]) for d in newer])
    changes: list[tuple[State | None, State]] = [
        (None, state_of(latest[d])) for d in ids if d in new]
    changes += [(old.get(d), state_of(latest[d])) for d in newer]
    latest_counts.apply_changes(session.connection(), changes, now)


def _deployment_row(e: EventLike) -> dict[str, Any]:
    row = _event_row(e)
    del row["policy_digest"]
    row["config"] = e.config
    return row


DailyKey = tuple[dt.date, str, str, str, bool]
ReasonKey = tuple[dt.date, str, str, bool]


def daily_counts(events: Iterable[EventLike],
                 into: tuple[Counter[DailyKey], Counter[ReasonKey]] | None = None
                 ) -> tuple[Counter[DailyKey], Counter[ReasonKey]]:
    """Events per (UTC day, family, runner, reason code, demo) and fallback events per (day,
    family, reason key, demo): the daily roll-ups' increments."""
    decisions, reasons = into if into is not None else (Counter(), Counter())
    for e in events:
        day = e.at.astimezone(dt.UTC).date()
        decisions[(day, e.family, e.runner or "", e.reason_code, e.demo)] += 1
        if e.runner == "v2":
            continue  # the reasons roll-up is of fallbacks (same keys as the ranking)
        for key in set(reason_keys(list(e.rule_ids), e.reason_code, e.stage)):
            reasons[(day, e.family, key, e.demo)] += 1
    return decisions, reasons


def add_daily(session: Session, events: Iterable[EventLike]) -> None:
    write_daily(session, *daily_counts(events))


def write_daily(session: Session, decisions: Counter[DailyKey],
                reasons: Counter[ReasonKey]) -> None:
    """Add to the daily roll-ups (an upsert per key, in key order)."""
    if session.get_bind().dialect.name == "sqlite":
        from dashboard.store.ingest_sqlite import write_daily_sqlite

        write_daily_sqlite(session.connection(), decisions, reasons)
        return
    _upsert_counts(session, DailyDecisions, ["day", "family", "runner", "reason_code", "demo"],
                   decisions)
    _upsert_counts(session, DailyReasons, ["day", "family", "rule_id", "demo"], reasons)


def _upsert_counts(session: Session, table: Any, keys: list[str], counts: Counter[Any]) -> None:
    if not counts:
        return
    rows = [dict(zip(keys, k, strict=True), num_events=n) for k, n in sorted(counts.items())]
    core = table.__table__
    stmt = _insert(session, core)
    stmt = stmt.on_conflict_do_update(
        index_elements=keys, set_={"num_events": core.c.num_events + stmt.excluded.num_events})
    session.execute(stmt, rows)


def count_events(*, session: Session, demo: bool | None = None) -> int:
    from sqlalchemy import func

    stmt = select(func.count()).select_from(DecisionEvent)
    if demo is not None:
        stmt = stmt.where(DecisionEvent.demo.is_(demo))
    return int(session.scalar(stmt) or 0)


def remove_demo(*, session: Session) -> int:
    """Delete every demo event, deployment and roll-up row; returns the events removed."""
    num = count_events(session=session, demo=True)
    for table in (DecisionEvent, Deployment, DailyDecisions, DailyReasons, LatestCounts):
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
    stmt = select(DecisionEvent).order_by(DecisionEvent.at.desc(),
                                          DecisionEvent.event_id).limit(limit)
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
        return [e for e in scan if rule in e.rule_ids
                or (not e.rule_ids and e.reason_code == rule)][:limit]
    return list(session.scalars(stmt))
