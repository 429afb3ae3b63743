"""Bulk load of decision events (benchmarks, imports of a fleet's history).

The events are inserted as they are (``COPY`` on PostgreSQL, the driver's ``executemany`` on
SQLite), and at the end each deployment's latest decision is advanced once, through the code
ingest uses (``events.advance_deployments``, which keeps ``latest_counts`` with it), and the
daily roll-up is added from the same counting function (``events.daily_counts``). The
tables come out as batched ingest of the same events leaves them
(tests/dashboard/test_fallback_aggregates.py compares the two), at a fraction of the cost:
10,000,000 events in minutes instead of an hour.

Unlike ingest, a bulk load does not skip events it has seen: an event id that is stored
already, or repeated in the load, is an error (:class:`DuplicateEvents`) and the caller's
transaction is left to roll back. So is a follow-up event carrying vLLM's start-up line
(:class:`FollowUpEvent`): it is no decision, and only batched ingest attaches it to one.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from turnout.dashboard.store.errors import StoreError
from turnout.dashboard.store.events import (
    DailyKey,
    EventLike,
    advance_deployments,
    daily_counts,
    latest_per_deployment,
    write_daily,
)
from turnout.dashboard.store.latest_counts import prune_hourly
from turnout.dashboard.store.launches import follows, launch_json

_COLUMNS = (
    "event_id",
    "at",
    "deployment_id",
    "host",
    "pack",
    "family",
    "runner",
    "mode",
    "stage",
    "reason_code",
    "rule_ids",
    "policy_digest",
    "demo",
    "launch",
)
_ADVANCE_CHUNK = 5000  # deployments per advance (bounded statements and memory)


class DuplicateEvents(StoreError):
    """A bulk load met an event id that is stored already or repeated in the load."""


class FollowUpEvent(StoreError):
    """A bulk load met a follow-up event (vLLM's start-up line, ``<id>.startup``): no decision
    to load; batched ingest attaches it to its decision."""


def bulk_ingest(
    *,
    session: Session,
    events: Iterable[EventLike],
    now: dt.datetime | None = None,
    chunk: int = 50_000,
) -> int:
    """Store ``events`` (any number: read ``chunk`` at a time) in the caller's transaction;
    returns how many. ``now``: as for ``events.ingest``.

    Raises:
        DuplicateEvents: an event id is stored already or repeated in ``events``.
        FollowUpEvent: a follow-up event (``dashboard/store/launches.py``) is in ``events``.
    """
    now = now or dt.datetime.now(dt.UTC)
    conn = session.connection()
    latest: dict[str, EventLike] = {}
    counts: Counter[DailyKey] = Counter()
    total = 0
    for part in _chunks(events, chunk):
        _refuse_follow_ups(part)
        try:
            _insert(conn, part)
        except IntegrityError as err:  # SQLite
            raise DuplicateEvents(f"bulk load: {err.orig}") from err
        except Exception as err:  # PostgreSQL's COPY raises the driver's own error
            if getattr(err, "sqlstate", None) == "23505":
                raise DuplicateEvents(f"bulk load: {str(err).splitlines()[0]}") from err
            raise
        latest_per_deployment(part, into=latest)
        daily_counts(part, into=counts)
        total += len(part)
    ids = sorted(latest)
    for start in range(0, len(ids), _ADVANCE_CHUNK):
        advance_deployments(session, [latest[d] for d in ids[start : start + _ADVANCE_CHUNK]], now)
    write_daily(session, counts)
    prune_hourly(session.connection(), now)
    return total


def _refuse_follow_ups(part: list[EventLike]) -> None:
    for e in part:
        if follows(e) is not None:
            raise FollowUpEvent(
                f"bulk load: {e.event_id} is a follow-up event (vLLM's start-up "
                "line), not a decision: send it through ingest"
            )


def _chunks(events: Iterable[EventLike], size: int) -> Iterator[list[EventLike]]:
    it = iter(events)
    while part := list(itertools.islice(it, size)):
        yield part


@lru_cache(maxsize=4096)
def _rules_json(rule_ids: tuple[str, ...]) -> str:
    return json.dumps(list(rule_ids))


def _insert(conn: Connection, events: list[EventLike]) -> None:
    if conn.dialect.name == "sqlite":
        from turnout.dashboard.store.ingest_sqlite import insert_events_sqlite

        insert_events_sqlite(conn, events)
        return
    raw: Any = conn.connection.driver_connection  # psycopg's connection, in this transaction
    with (
        raw.cursor() as cur,
        cur.copy(f"COPY decision_events ({', '.join(_COLUMNS)}) FROM STDIN") as copy,
    ):
        for e in events:
            copy.write_row(
                (
                    e.event_id,
                    e.at,
                    e.deployment_id,
                    e.host,
                    e.pack,
                    e.family,
                    e.runner,
                    e.mode,
                    e.stage,
                    e.reason_code,
                    _rules_json(tuple(e.rule_ids)),
                    e.policy_digest,
                    e.demo,
                    launch_json(e),
                )
            )
