"""The PostgreSQL ingest path: the writes of :func:`dashboard.store.events.ingest`, each one
statement over arrays (``INSERT ... SELECT ... FROM unnest(%s::text[], ...)``) whatever the
batch size. SQLAlchemy's executemany builds a multi-row ``VALUES`` statement whose text
differs with every batch size, which the driver parses again each time: at 500 events a
batch that parsing alone cost more than the database's work (benchmarks/service_load.py).
Errors still come through SQLAlchemy (``exec_driver_sql``), so a value the database refuses
is the same ``DataError`` as before.

Concurrent ingests never lose a count and never deadlock: every statement takes its rows in
key order (events by id, deployments by id, counts by key), new deployments are inserted
first (``ON CONFLICT DO NOTHING``: a second transaction inserting the same id waits for the
first), and the existing ones are read ``FOR UPDATE`` before their counts move.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from turnout.dashboard.store.latest_counts import Key, Move, apply_moves, move, state_of
from turnout.dashboard.store.launches import launch_json

_EVENT_COLUMNS = (
    ("event_id", "text"),
    ("at", "timestamptz"),
    ("deployment_id", "text"),
    ("host", "text"),
    ("pack", "text"),
    ("family", "text"),
    ("runner", "text"),
    ("mode", "text"),
    ("stage", "text"),
    ("reason_code", "text"),
    ("rule_ids", "jsonb"),
    ("policy_digest", "text"),
    ("demo", "boolean"),
    ("launch", "jsonb"),
)
_DEPLOYMENT_COLUMNS = (
    ("deployment_id", "text"),
    ("event_id", "text"),
    ("at", "timestamptz"),
    ("host", "text"),
    ("pack", "text"),
    ("family", "text"),
    ("runner", "text"),
    ("mode", "text"),
    ("stage", "text"),
    ("reason_code", "text"),
    ("rule_ids", "jsonb"),
    ("config", "jsonb"),
    ("demo", "boolean"),
)


def _insert_select(table: str, columns: Sequence[tuple[str, str]], order: str) -> str:
    """``INSERT INTO table (...) SELECT ... FROM unnest(%s::type[], ...) ORDER BY order``;
    JSON columns travel as text and are cast per row."""
    names = [c for c, _t in columns]
    arrays = ", ".join(f"%b::{'text' if t == 'jsonb' else t}[]" for _c, t in columns)
    values = ", ".join(f"{c}::jsonb" if t == "jsonb" else c for c, t in columns)
    return (
        f"INSERT INTO {table} ({', '.join(names)}) SELECT {values} "
        f"FROM unnest({arrays}) AS t({', '.join(names)}) ORDER BY {order}"
    )


_INSERT_EVENTS = (
    _insert_select("decision_events", _EVENT_COLUMNS, "event_id")
    + " ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
_INSERT_DEPLOYMENTS = (
    _insert_select("deployments", _DEPLOYMENT_COLUMNS, "deployment_id")
    + " ON CONFLICT (deployment_id) DO NOTHING RETURNING deployment_id"
)
_UPDATE_DEPLOYMENTS = (
    _insert_select("deployments", _DEPLOYMENT_COLUMNS, "deployment_id")
    + " ON CONFLICT (deployment_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c, _t in _DEPLOYMENT_COLUMNS[1:])
    # Out-of-order delivery: an older event never overwrites a newer decision.
    + " WHERE (deployments.at, deployments.event_id) < (excluded.at, excluded.event_id)"
)
_SELECT_STATES = (
    "SELECT deployment_id, at, event_id, pack, family, stage, runner, reason_code, rule_ids, "
    "demo FROM deployments WHERE deployment_id = ANY(%b::text[]) ORDER BY deployment_id "
    "FOR UPDATE"
)
_COUNT_COLUMNS = (
    ("bucket_s", "integer"),
    ("bucket", "bigint"),
    ("reason", "text"),
    ("kind", "text"),
    ("family", "text"),
    ("stage", "text"),
    ("pack", "text"),
    ("runner", "text"),
    ("demo", "boolean"),
    ("num_deployments", "integer"),
)
_KEY = ", ".join(c for c, _t in _COUNT_COLUMNS[:-1])
UPSERT_COUNTS = (
    _insert_select("latest_counts", _COUNT_COLUMNS, _KEY) + f" ON CONFLICT ({_KEY}) DO UPDATE SET "
    "num_deployments = latest_counts.num_deployments + excluded.num_deployments"
)
# Rows at zero that no other transaction holds: the sweep waits for no lock, so although it
# takes rows out of key order it closes no wait cycle (it runs last in its transaction).
DELETE_ZEROS = (
    "DELETE FROM latest_counts WHERE ctid = ANY(ARRAY(SELECT ctid FROM "
    "latest_counts WHERE num_deployments = 0 FOR UPDATE SKIP LOCKED))"
)
_DAILY_COLUMNS = (
    ("day", "date"),
    ("family", "text"),
    ("runner", "text"),
    ("reason_code", "text"),
    ("demo", "boolean"),
    ("num_events", "integer"),
)
_UPSERT_DAILY = (
    _insert_select("daily_decisions", _DAILY_COLUMNS, "day, family, runner, reason_code, demo")
    + " ON CONFLICT (day, family, runner, reason_code, demo) DO UPDATE SET "
    "num_events = daily_decisions.num_events + excluded.num_events"
)


def _columns(rows: Sequence[Sequence[Any]], width: int) -> tuple[list[Any], ...]:
    """Rows → one list per column (the statements' array parameters)."""
    return tuple(list(col) for col in zip(*rows, strict=True)) if rows else ([],) * width


def insert_events_pg(conn: Connection, events: Sequence[Any]) -> set[str]:
    """Insert the events whose ids are not stored yet; returns those ids."""
    rows = [
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
            json.dumps(list(e.rule_ids)),
            e.policy_digest,
            bool(e.demo),
            launch_json(e),
        )
        for e in events
    ]
    result = conn.exec_driver_sql(_INSERT_EVENTS, _columns(rows, len(_EVENT_COLUMNS)))
    return {r[0] for r in result}


def _deployment_rows(events: Sequence[Any]) -> tuple[list[Any], ...]:
    rows = [
        (
            e.deployment_id,
            e.event_id,
            e.at,
            e.host,
            e.pack,
            e.family,
            e.runner,
            e.mode,
            e.stage,
            e.reason_code,
            json.dumps(list(e.rule_ids)),
            None if e.config is None else json.dumps(e.config),
            bool(e.demo),
        )
        for e in events
    ]
    return _columns(rows, len(_DEPLOYMENT_COLUMNS))


def advance_pg(conn: Connection, latest: Sequence[Any], now: dt.datetime) -> None:
    """``events.advance_deployments`` on PostgreSQL: ``latest`` holds one event per
    deployment."""
    by_id = {e.deployment_id: e for e in latest}
    ids = sorted(by_id)
    ordered = [by_id[d] for d in ids]
    new = {r[0] for r in conn.exec_driver_sql(_INSERT_DEPLOYMENTS, _deployment_rows(ordered))}
    existing = [d for d in ids if d not in new]
    old = (
        {r.deployment_id: r for r in conn.exec_driver_sql(_SELECT_STATES, (existing,))}
        if existing
        else {}
    )
    newer = [
        by_id[d]
        for d in existing
        if d not in old or (by_id[d].at, by_id[d].event_id) > (old[d].at, old[d].event_id)
    ]
    if newer:
        conn.exec_driver_sql(_UPDATE_DEPLOYMENTS, _deployment_rows(newer))
    moves: list[Move] = [move(None, state_of(by_id[d])) for d in ids if d in new]
    moves += [
        move(state_of(old[e.deployment_id]) if e.deployment_id in old else None, state_of(e))
        for e in newer
    ]
    apply_moves(conn, moves, now)


def write_counts_pg(conn: Connection, ordered: list[tuple[Key, int]]) -> None:
    """Add counts (in key order) to ``latest_counts``."""
    conn.exec_driver_sql(
        UPSERT_COUNTS, _columns([(*k, n) for k, n in ordered], len(_COUNT_COLUMNS))
    )


def write_daily_pg(conn: Connection, decisions: Counter[Any]) -> None:
    if decisions:
        conn.exec_driver_sql(
            _UPSERT_DAILY,
            _columns([(*k, n) for k, n in sorted(decisions.items())], len(_DAILY_COLUMNS)),
        )
