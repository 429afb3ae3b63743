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

from dashboard.store.latest_counts import State, apply_changes, state_of


def _stored(t: dt.datetime) -> str:
    """SQLAlchemy's SQLite DATETIME storage format (zero-padded, so string order = time order;
    ``strftime("%Y")`` would not pad years before 1000)."""
    return t.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")

_EVENT_COLUMNS = ("event_id", "at", "deployment_id", "host", "pack", "family", "runner", "mode",
                  "stage", "reason_code", "rule_ids", "policy_digest", "demo")
_DEPLOYMENT_COLUMNS = ("deployment_id", "event_id", "at", "host", "pack", "family", "runner",
                       "mode", "stage", "reason_code", "rule_ids", "config", "demo")


def _sql_insert(table: str, columns: Sequence[str]) -> str:
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})")


_INSERT_EVENTS = _sql_insert("decision_events", _EVENT_COLUMNS)
_UPSERT_DEPLOYMENTS = (
    _sql_insert("deployments", _DEPLOYMENT_COLUMNS)
    + " ON CONFLICT (deployment_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _DEPLOYMENT_COLUMNS[1:])
    # Out-of-order delivery: an older event never overwrites a newer decision.
    + " WHERE (deployments.at, deployments.event_id) < (excluded.at, excluded.event_id)")
_UPSERT_DAILY_DECISIONS = (
    _sql_insert("daily_decisions", ("day", "family", "runner", "reason_code", "demo",
                                    "num_events"))
    + " ON CONFLICT (day, family, runner, reason_code, demo) DO UPDATE SET"
      " num_events = daily_decisions.num_events + excluded.num_events")
_UPSERT_DAILY_REASONS = (
    _sql_insert("daily_reasons", ("day", "family", "rule_id", "demo", "num_events"))
    + " ON CONFLICT (day, family, rule_id, demo) DO UPDATE SET"
      " num_events = daily_reasons.num_events + excluded.num_events")
_STATE_COLUMNS = ("deployment_id", "at", "event_id", "pack", "family", "stage", "runner",
                  "reason_code", "rule_ids", "demo")


def ingest_sqlite(session: Session, events: Sequence[Any], now: dt.datetime) -> int:
    """Store a batch of events (``EventLike``) in the caller's transaction; returns how many
    were new."""
    from dashboard.store.events import add_daily, latest_per_deployment

    conn = session.connection()
    fresh = _new_events(conn, events)
    if not fresh:
        return 0
    insert_events_sqlite(conn, fresh)
    advance_sqlite(conn, list(latest_per_deployment(fresh).values()), now)
    add_daily(session, fresh)
    return len(fresh)


def insert_events_sqlite(conn: Connection, events: Sequence[Any]) -> None:
    """Insert events as they are (duplicates of stored ids raise IntegrityError)."""
    conn.exec_driver_sql(_INSERT_EVENTS, [
        (e.event_id, _stored(e.at.astimezone(dt.UTC)), e.deployment_id, e.host, e.pack,
         e.family, e.runner, e.mode, e.stage, e.reason_code, _rules_json(tuple(e.rule_ids)),
         e.policy_digest, int(e.demo)) for e in events])


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
    seen = {r[0] for r in _select_in(conn, "SELECT event_id FROM decision_events WHERE "
                                           "event_id IN", ids)}
    return [e for e in unique if e.event_id not in seen]


def _select_in(conn: Connection, head: str, ids: Sequence[str]) -> list[Any]:
    rows: list[Any] = []
    for start in range(0, len(ids), 900):  # SQLite's bound-parameter limit, with room
        chunk = ids[start:start + 900]
        rows += conn.exec_driver_sql(f"{head} ({', '.join('?' for _ in chunk)})",
                                     tuple(chunk)).fetchall()
    return rows


def _state(row: Any) -> State:
    return State(dt.datetime.fromisoformat(row[1]).replace(tzinfo=dt.UTC), row[2], row[3],
                 row[4], row[5], row[6], row[7], _rules_tuple(row[8]), bool(row[9]))


def advance_sqlite(conn: Connection, latest: Sequence[Any], now: dt.datetime) -> None:
    """``events.advance_deployments`` on SQLite: ``latest`` holds one event per deployment.
    The write transaction excludes other writers, so the stored states read first stay
    current until the commit."""
    latest = sorted(latest, key=lambda e: e.deployment_id)
    old = {r[0]: r for r in _select_in(
        conn, f"SELECT {', '.join(_STATE_COLUMNS)} FROM deployments WHERE deployment_id IN",
        [e.deployment_id for e in latest])}
    rows = []
    changes: list[tuple[State | None, State]] = []
    for e in latest:
        at = _stored(e.at.astimezone(dt.UTC))
        cur = old.get(e.deployment_id)
        # Stored times are zero-padded UTC strings: string order is time order.
        if cur is not None and (at, e.event_id) <= (cur[1], cur[2]):
            continue
        rows.append((e.deployment_id, e.event_id, at, e.host, e.pack, e.family, e.runner,
                     e.mode, e.stage, e.reason_code, _rules_json(tuple(e.rule_ids)),
                     None if e.config is None else json.dumps(e.config), int(e.demo)))
        changes.append((None if cur is None else _state(cur), state_of(e)))
    if rows:
        conn.exec_driver_sql(_UPSERT_DEPLOYMENTS, rows)
    apply_changes(conn, changes, now)


def write_daily_sqlite(conn: Connection, decisions: Counter[Any], reasons: Counter[Any]
                       ) -> None:
    if decisions:
        conn.exec_driver_sql(_UPSERT_DAILY_DECISIONS, [
            (day.isoformat(), family, runner, code, int(demo), n)
            for (day, family, runner, code, demo), n in sorted(decisions.items())])
    if reasons:
        conn.exec_driver_sql(_UPSERT_DAILY_REASONS, [
            (day.isoformat(), family, key, int(demo), n)
            for (day, family, key, demo), n in sorted(reasons.items())])
