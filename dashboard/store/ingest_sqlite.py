"""The SQLite ingest path: the same writes as :func:`dashboard.store.events.ingest` through the
driver's ``executemany`` with values prepared once, which is several times cheaper per event
than SQLAlchemy's per-row parameter processing (measured: benchmarks/service_load.py).

Duplicates are found with one indexed lookup before inserting. That is exact here because a
SQLite write transaction (``BEGIN IMMEDIATE``) excludes every other writer; PostgreSQL takes the
``INSERT ... ON CONFLICT DO NOTHING RETURNING`` path instead.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from turnout.dashboard.store.latest_counts import Move, apply_moves, suffixes_of
from turnout.dashboard.store.launches import launch_json


def _stored(t: dt.datetime) -> str:
    """SQLAlchemy's SQLite DATETIME storage format (zero-padded, so string order = time order;
    ``strftime("%Y")`` would not pad years before 1000)."""
    return t.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


_EVENT_COLUMNS = (
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
_DEPLOYMENT_COLUMNS = (
    "deployment_id",
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
    "config",
    "demo",
)


def _sql_insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


_INSERT_EVENTS = _sql_insert("decision_events", _EVENT_COLUMNS)
_INSERT_DEPLOYMENTS = _sql_insert("deployments", _DEPLOYMENT_COLUMNS)
# The stored states were read in this (exclusive) transaction: each deployment is known new
# or stored, and a plain UPDATE by key costs less than an upsert's failed insert first.
_UPDATE_DEPLOYMENTS = (
    "UPDATE deployments SET "
    + ", ".join(f"{c} = ?" for c in _DEPLOYMENT_COLUMNS[1:])
    + " WHERE deployment_id = ?"
)
_UPSERT_DAILY_DECISIONS = (
    _sql_insert("daily_decisions", ("day", "family", "runner", "reason_code", "demo", "num_events"))
    + " ON CONFLICT (day, family, runner, reason_code, demo) DO UPDATE SET"
    " num_events = daily_decisions.num_events + excluded.num_events"
)
_STATE_COLUMNS = (
    "deployment_id",
    "at",
    "event_id",
    "pack",
    "family",
    "stage",
    "runner",
    "reason_code",
    "rule_ids",
    "demo",
)


def ingest_sqlite(session: Session, events: Sequence[Any], now: dt.datetime) -> int:
    """Store a batch of events (``EventLike``) in the caller's transaction; returns how many
    were new."""
    from turnout.dashboard.store.events import add_daily, latest_per_deployment

    conn = session.connection()
    fresh = _new_events(conn, events)
    if not fresh:
        return 0
    stored = {e.event_id: _stored(e.at.astimezone(dt.UTC)) for e in fresh}  # once an event
    insert_events_sqlite(conn, fresh, stored)
    advance_sqlite(conn, list(latest_per_deployment(fresh).values()), now, stored)
    add_daily(session, fresh)
    return len(fresh)


def insert_events_sqlite(
    conn: Connection, events: Sequence[Any], stored: dict[str, str] | None = None
) -> None:
    """Insert events as they are (duplicates of stored ids raise IntegrityError); ``stored``:
    event id → its time as stored, where known already."""
    at = stored or {e.event_id: _stored(e.at.astimezone(dt.UTC)) for e in events}
    conn.exec_driver_sql(
        _INSERT_EVENTS,
        [
            (
                e.event_id,
                at[e.event_id],
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
                int(e.demo),
                launch_json(e),
            )
            for e in events
        ],
    )


@lru_cache(maxsize=4096)
def _rules_json(rule_ids: tuple[str, ...]) -> str:
    """A fleet has few distinct reason lists; each is encoded once."""
    return json.dumps(list(rule_ids))


@lru_cache(maxsize=4096)
def _rules_tuple(stored: str) -> tuple[str, ...]:
    return tuple(json.loads(stored))


def _new_events(conn: Connection, events: Sequence[Any]) -> list[Any]:
    """The events whose ids are neither stored nor repeated earlier in the batch."""
    unique = list({e.event_id: e for e in events}.values())
    ids = [e.event_id for e in unique]
    seen = {
        r[0]
        for r in _select_in(conn, "SELECT event_id FROM decision_events WHERE event_id IN", ids)
    }
    return [e for e in unique if e.event_id not in seen]


def _select_in(conn: Connection, head: str, ids: Sequence[str]) -> list[Any]:
    """Rows (plain tuples) of ``head (?, ?, ...)`` over ``ids``, through the driver's own
    cursor in the connection's transaction: result rows cost a few times more through
    SQLAlchemy's result objects."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    rows: list[Any] = []
    try:
        for start in range(0, len(ids), 900):  # SQLite's bound-parameter limit, with room
            chunk = ids[start : start + 900]
            rows += cursor.execute(f"{head} ({', '.join('?' for _ in chunk)})", chunk).fetchall()
    finally:
        cursor.close()
    return rows


def _epoch(stored: str) -> int:
    """Epoch seconds of a stored time (``YYYY-MM-DD HH:MM:SS[.ffffff]``, UTC)."""
    return _day_epoch(stored[:10]) + (
        int(stored[11:13]) * 3600 + int(stored[14:16]) * 60 + int(stored[17:19])
    )


@lru_cache(maxsize=4096)
def _day_epoch(day: str) -> int:
    return int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp())


def advance_sqlite(
    conn: Connection, latest: Sequence[Any], now: dt.datetime, stored: dict[str, str] | None = None
) -> None:
    """``events.advance_deployments`` on SQLite: ``latest`` holds one event per deployment.
    The write transaction excludes other writers, so the stored states read first stay
    current until the commit."""
    latest = sorted(latest, key=lambda e: e.deployment_id)
    old = {
        r[0]: r
        for r in _select_in(
            conn,
            f"SELECT {', '.join(_STATE_COLUMNS)} FROM deployments WHERE deployment_id IN",
            [e.deployment_id for e in latest],
        )
    }
    inserts, updates = [], []
    moves: list[Move] = []
    for e in latest:
        at = stored[e.event_id] if stored else _stored(e.at.astimezone(dt.UTC))
        cur = old.get(e.deployment_id)
        # Stored times are zero-padded UTC strings: string order is time order.
        if cur is not None and (at, e.event_id) <= (cur[1], cur[2]):
            continue
        rule_ids = tuple(e.rule_ids)
        values = (
            e.event_id,
            at,
            e.host,
            e.pack,
            e.family,
            e.runner,
            e.mode,
            e.stage,
            e.reason_code,
            _rules_json(rule_ids),
            None if e.config is None else json.dumps(e.config),
            int(e.demo),
        )
        if cur is None:
            inserts.append((e.deployment_id, *values))
        else:
            updates.append((*values, e.deployment_id))
        new = suffixes_of(e.runner, rule_ids, e.reason_code, e.stage, e.family, e.pack, e.demo)
        if cur is None:
            moves.append((0, None, _epoch(at), new))
        else:  # the stored row: (id, at, event_id, pack, family, stage, runner, code, rules, demo)
            moves.append(
                (
                    _epoch(cur[1]),
                    suffixes_of(
                        cur[6], _rules_tuple(cur[8]), cur[7], cur[5], cur[4], cur[3], bool(cur[9])
                    ),
                    _epoch(at),
                    new,
                )
            )
    if inserts:
        conn.exec_driver_sql(_INSERT_DEPLOYMENTS, inserts)
    if updates:
        conn.exec_driver_sql(_UPDATE_DEPLOYMENTS, updates)
    apply_moves(conn, moves, now)


def write_daily_sqlite(conn: Connection, decisions: Counter[Any]) -> None:
    if decisions:
        conn.exec_driver_sql(
            _UPSERT_DAILY_DECISIONS,
            [
                (day.isoformat(), family, runner, code, int(demo), n)
                for (day, family, runner, code, demo), n in sorted(decisions.items())
            ],
        )
