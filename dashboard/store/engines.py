"""Registered serving engines: the registration and its heartbeat (one upsert), a clean exit,
and the live list.

An engine is live when it has not ended (``DELETE``) and its last heartbeat is at most
``ttl`` old (the service's ``engine_ttl_s``): an engine killed without a goodbye drops out of
Prometheus' targets and of the list of engines on an old decision once ``ttl`` has passed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from turnout.dashboard.store.models import Engine
from turnout.oracle.wire import EngineIn

# What a heartbeat may change of a stored engine: everything but its id and its first
# registration time.
_UPDATED = (
    "deployment_id",
    "host",
    "address",
    "scheme",
    "metrics_path",
    "engine",
    "vllm_version",
    "pack",
    "family",
    "stage",
    "runner",
    "mode",
    "cohort",
    "policy_digest",
    "config",
    "started_at",
    "last_seen_at",
    "ended_at",
)


#: How long the row of an engine that ended or stopped beating is kept (the list reads only
#: live ones; every process start registers a new id, so old rows would pile up).
KEEP_GONE = dt.timedelta(days=7)


def register(*, session: Session, engine: EngineIn, now: dt.datetime) -> bool:
    """Store the registration (or its heartbeat: the same body again) at ``now``; the caller
    commits. True when the engine is new (or came back after its clean exit).

    Another live engine at the same address is ended: one host:port is one process, and a
    process restarted after a kill -9 would otherwise be scraped twice, under both its old
    and its new cohort, until the old one's heartbeat expired. Rows gone for
    :data:`KEEP_GONE` are deleted."""
    session.execute(
        update(Engine)
        .where(
            Engine.address == engine.address,
            Engine.engine_id != engine.engine_id,
            Engine.ended_at.is_(None),
        )
        .values(ended_at=now)
    )
    session.execute(delete(Engine).where(Engine.last_seen_at < now - KEEP_GONE))
    before = session.get(Engine, engine.engine_id)
    fresh = before is None or before.ended_at is not None
    row: dict[str, Any] = engine.model_dump()
    row.update(registered_at=now, last_seen_at=now, ended_at=None)
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(Engine).values(row)
    stmt = stmt.on_conflict_do_update(
        index_elements=["engine_id"], set_={name: stmt.excluded[name] for name in _UPDATED}
    )
    session.execute(stmt)
    return fresh


def end(*, session: Session, engine_id: str, now: dt.datetime) -> bool:
    """Mark an engine's clean exit; the caller commits. False for an unknown or ended one."""
    result = session.execute(
        update(Engine)
        .where(Engine.engine_id == engine_id, Engine.ended_at.is_(None))
        .values(ended_at=now)
    )
    return bool(getattr(result, "rowcount", 0))


def live(
    *, session: Session, now: dt.datetime, ttl: dt.timedelta, stage: str | None = None
) -> Sequence[Engine]:
    """The live engines at ``now``, by deployment then address."""
    stmt = select(Engine).where(Engine.ended_at.is_(None), Engine.last_seen_at >= now - ttl)
    if stage is not None:
        stmt = stmt.where(Engine.stage == stage)
    return session.scalars(stmt.order_by(Engine.deployment_id, Engine.address)).all()


__all__ = ["end", "live", "register"]
