"""Reading the decision history: filtered counts, pages in a stable order, the whole of a
filter for an export, and one deployment's record.

Order: newest first, ties by ``event_id`` (the key), so every event has one place and a page
boundary is a :class:`Cursor` (keyset paging): a page does not shift when new events arrive
while someone pages, and going to the next page costs an index range, not an ``OFFSET`` scan.
The rule filter runs in SQL (``json_each`` on SQLite, ``@>`` on PostgreSQL's JSONB), so counts
and pages agree with the filter exactly.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, type_coerce
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from turnout.dashboard.store.models import DecisionEvent, Deployment

MAX_PAGE_SIZE = 500
_CURSOR_SEP = "~"  # not in an event id (``[A-Za-z0-9._:-]``) nor in an ISO time


@dataclass(frozen=True)
class EventFilter:
    """What the Decisions page, its export and a deployment's history select; ``start`` is
    inclusive, ``end`` exclusive (UTC). ``runner="none"``: decisions without a runner.
    ``rule_id`` is a ranking key of the fallback page: a rule id, ``rule:stage`` for the
    per-stage rollout reasons, or a reason code for decisions that carry no rule."""

    family: str | None = None
    runner: str | None = None
    reason_code: str | None = None
    rule_id: str | None = None
    deployment_id: str | None = None
    start: dt.datetime | None = None
    end: dt.datetime | None = None


@dataclass(frozen=True)
class Cursor:
    """A place in the order: the (time, event id) of an event."""

    at: dt.datetime
    event_id: str

    def encode(self) -> str:
        return f"{self.at.astimezone(dt.UTC).isoformat()}{_CURSOR_SEP}{self.event_id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """Raises ValueError for text that :meth:`encode` did not make."""
        at, sep, event_id = text.partition(_CURSOR_SEP)
        try:
            when = dt.datetime.fromisoformat(at)
        except ValueError:
            when = None
        if not sep or not event_id or when is None or when.tzinfo is None:
            raise ValueError(f"{text[:80]!r} is not a page position (follow the page's links)")
        return cls(when, event_id)

    @classmethod
    def of(cls, e: DecisionEvent) -> Cursor:
        return cls(e.at, e.event_id)


@dataclass
class EventPage:
    """One page: its rows, how many events match in all, the 1-based place of its first row,
    and the cursors of the pages before (newer) and after (older); None at either end."""

    rows: list[DecisionEvent]
    total: int
    first: int
    newer: Cursor | None
    older: Cursor | None


def _has_rule(session: Session, rule: str) -> Any:
    """SQL for: the event's ``rule_ids`` holds ``rule``."""
    if session.get_bind().dialect.name == "postgresql":
        return type_coerce(DecisionEvent.rule_ids, JSONB).contains([rule])
    each = func.json_each(DecisionEvent.rule_ids).table_valued("value")
    return exists().select_from(each).where(each.c.value == rule)


def _no_rules(session: Session) -> Any:
    length = (
        func.jsonb_array_length
        if session.get_bind().dialect.name == "postgresql"
        else func.json_array_length
    )
    return length(DecisionEvent.rule_ids) == 0


def _where(session: Session, f: EventFilter) -> list[Any]:
    out: list[Any] = []
    if f.family:
        out.append(DecisionEvent.family == f.family)
    if f.runner == "none":
        out.append(DecisionEvent.runner.is_(None))
    elif f.runner:
        out.append(DecisionEvent.runner == f.runner)
    if f.reason_code:
        out.append(DecisionEvent.reason_code == f.reason_code)
    if f.deployment_id:
        out.append(DecisionEvent.deployment_id == f.deployment_id)
    if f.start is not None:
        out.append(DecisionEvent.at >= f.start)
    if f.end is not None:
        out.append(DecisionEvent.at < f.end)
    if f.rule_id:
        rule, _, stage = f.rule_id.partition(":")
        if stage:
            out.append(DecisionEvent.stage == stage)
        out.append(
            or_(
                _has_rule(session, rule),
                and_(_no_rules(session), DecisionEvent.reason_code == rule),
            )
        )
    return out


def _newer_than(c: Cursor) -> Any:
    """Events before ``c`` in the order (newest first, then by event id)."""
    return or_(
        DecisionEvent.at > c.at, and_(DecisionEvent.at == c.at, DecisionEvent.event_id < c.event_id)
    )


def _older_than(c: Cursor) -> Any:
    return or_(
        DecisionEvent.at < c.at, and_(DecisionEvent.at == c.at, DecisionEvent.event_id > c.event_id)
    )


def count_events(*, session: Session, where: EventFilter) -> int:
    """How many events match."""
    stmt = select(func.count()).select_from(DecisionEvent).where(*_where(session, where))
    return int(session.scalar(stmt) or 0)


def page_events(
    *,
    session: Session,
    where: EventFilter,
    size: int = 50,
    after: Cursor | None = None,
    before: Cursor | None = None,
) -> EventPage:
    """The ``size`` events that follow ``after`` (older), or precede ``before`` (newer), or
    the newest ones. Raises ValueError for a size outside 1..MAX_PAGE_SIZE or both cursors."""
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page size {size}: use 1 to {MAX_PAGE_SIZE}")
    if after is not None and before is not None:
        raise ValueError("give after or before, not both")
    conds = _where(session, where)
    newest_first = (DecisionEvent.at.desc(), DecisionEvent.event_id.asc())
    if before is not None:
        stmt = (
            select(DecisionEvent)
            .where(*conds, _newer_than(before))
            .order_by(DecisionEvent.at.asc(), DecisionEvent.event_id.desc())
            .limit(size + 1)
        )
        rows = list(session.scalars(stmt))
        more_newer = len(rows) > size
        rows = rows[:size][::-1]
        more_older = True
    else:
        stmt = select(DecisionEvent).where(*conds).order_by(*newest_first).limit(size + 1)
        if after is not None:
            stmt = stmt.where(_older_than(after))
        rows = list(session.scalars(stmt))
        more_older = len(rows) > size
        rows = rows[:size]
        more_newer = after is not None
    total = count_events(session=session, where=where)
    first = 1
    if rows and (after is not None or before is not None):
        ahead = (
            select(func.count())
            .select_from(DecisionEvent)
            .where(*conds, _newer_than(Cursor.of(rows[0])))
        )
        first = int(session.scalar(ahead) or 0) + 1
        more_newer = first > 1
    return EventPage(
        rows,
        total,
        first if rows else 0,
        Cursor.of(rows[0]) if rows and more_newer else None,
        Cursor.of(rows[-1]) if rows and more_older else None,
    )


def events_after(
    *, session: Session, where: EventFilter, after: Cursor | None, limit: int = 1000
) -> list[DecisionEvent]:
    """The next ``limit`` matching events after ``after`` (from the newest when None): an
    export walks the whole filter with these, one short read at a time."""
    stmt = (
        select(DecisionEvent)
        .where(*_where(session, where))
        .order_by(DecisionEvent.at.desc(), DecisionEvent.event_id.asc())
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(_older_than(after))
    return list(session.scalars(stmt))


def get_deployment(*, session: Session, deployment_id: str) -> Deployment | None:
    """A deployment's latest decision and the inputs its engine reported; None if unknown."""
    return session.get(Deployment, deployment_id)


def get_event(*, session: Session, event_id: str) -> DecisionEvent | None:
    """One stored decision event (a deployment's latest is its ``event_id``); None if unknown."""
    return session.get(DecisionEvent, event_id)


def families_by_stage(*, session: Session) -> dict[str, Counter[str]]:
    """Stage → family → deployments whose latest decision fell in that stage (what a cohort
    holds in the fleet, for stages that name attributes rather than families)."""
    stmt = (
        select(Deployment.stage, Deployment.family, func.count())
        .where(Deployment.stage.is_not(None))
        .group_by(Deployment.stage, Deployment.family)
    )
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for stage, family, n in session.execute(stmt):
        out[str(stage)][family] += int(n)
    return dict(out)
