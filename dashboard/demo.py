"""The first-run demo fleet: the real ``vllm serve`` lines of ``policies/reference/
vllm_recipes.jsonl``, each decided by the oracle and recorded as a demo deployment, so that a
newcomer's first page shows real fallback reasons. ``turnout demo remove`` deletes them all;
``turnout demo seed`` records them again (after a remove, or into any database).

Lines that do not parse (placeholders such as ``<checkpoint>``) are not deployments and are
skipped; their count is returned by :func:`demo_events`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from turnout import policies
from turnout.dashboard.services import Services
from turnout.dashboard.store import audit, events
from turnout.dashboard.store.events import EventRecord
from turnout.dashboard.store.models import ServiceMeta, utcnow
from turnout.oracle import OracleError, from_command
from turnout.oracle.client import event_from_decision

RECIPES = Path(policies.__file__).resolve().parent / "reference" / "vllm_recipes.jsonl"
DEMO_DAYS = 14
SEEDED = "demo_seeded"


def _spread(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")


def demo_events(
    services: Services, now: dt.datetime | None = None
) -> tuple[list[EventRecord], int]:
    """(events, lines skipped): one to three starts per recipe over the last two weeks, with
    deterministic event ids (two replicas seeding at once store each event once)."""
    now = now or utcnow()
    snap = services.policy.snapshot().canaries
    out: list[EventRecord] = []
    skipped = 0
    for line in RECIPES.read_text().splitlines():
        recipe = json.loads(line)
        try:
            # offline: the demo fleet is the recipes' known facts, not ~250 hub look-ups at start
            config = from_command(
                recipe["argv"],
                recipe.get("env") or {},
                offline=True,
                release=services.policy.release,
            )
        except OracleError:
            skipped += 1
            continue
        # decided as the deployment's own engine would: with its id, so a stage at a partial
        # share splits per deployment (without it, every deployment fell outside the share)
        deployment_id = f"demo/{recipe['id']}"
        decision = services.policy.decide(
            dataclasses.replace(config, deployment_id=deployment_id), snap
        )
        seed = _spread(recipe["id"])
        for n in range(1 + seed % 3):
            at = now - dt.timedelta(hours=(seed >> 4) % (DEMO_DAYS * 24) + 24 * n)
            data = event_from_decision(
                decision,
                config,
                pack=services.policy.pack_name,
                at=at,
                demo=True,
                deployment_id=deployment_id,
                host=f"demo-host-{seed % 17:02d}",
                event_id=f"demo-{recipe['id']}-{n}",
            )
            out.append(_record(data))
    return out, skipped


def _record(data: dict[str, Any]) -> EventRecord:
    return EventRecord(
        event_id=data["event_id"],
        at=dt.datetime.fromisoformat(data["at"]),
        deployment_id=data["deployment_id"],
        host=data["host"],
        pack=data["pack"],
        family=data["family"],
        runner=data["runner"],
        mode=data["mode"],
        stage=data["stage"],
        reason_code=data["reason_code"],
        rule_ids=tuple(data["rule_ids"]),
        policy_digest=data["policy_digest"],
        config=data["config"],
        demo=True,
    )


def seed_if_empty(services: Services) -> int:
    """Record the demo fleet when the database has never held a decision; returns how many
    events were stored (0 when it had events, or the demo was seeded before)."""
    with services.db.read_session() as session:
        if session.get(ServiceMeta, SEEDED) is not None or events.count_events(session=session):
            return 0
    records, _skipped = demo_events(services)
    with services.db.write_session() as session:
        services.db.lock_startup(session)  # replicas starting at once: one seeds
        if session.get(ServiceMeta, SEEDED) is not None:
            return 0
        num = events.ingest(session=session, events=records)
        session.merge(ServiceMeta(key=SEEDED, value=utcnow().isoformat()))
        session.commit()
    return num


def seed(services: Services, *, actor: str) -> tuple[int, int]:
    """Record the demo fleet now, whatever the database holds (audited); returns (events
    stored, events already there). Event ids are deterministic, so seeding twice stores each
    event once; a later start does not seed again."""
    records, _skipped = demo_events(services)
    with services.db.write_session() as session:
        services.db.lock_startup(session)
        num = events.ingest(session=session, events=records)
        session.merge(ServiceMeta(key=SEEDED, value=utcnow().isoformat()))
        audit.record(
            session=session,
            actor=actor,
            action="demo.seed",
            target="demo-fleet",
            reason="demo fleet recorded",
            before=None,
            after={"events": num, "already_there": len(records) - num},
        )
        session.commit()
    return num, len(records) - num


def remove(services: Services, *, actor: str) -> int:
    """Delete every demo event, deployment and roll-up row (audited); returns events removed."""
    with services.db.write_session() as session:
        num = events.remove_demo(session=session)
        seeded = session.scalars(select(ServiceMeta).where(ServiceMeta.key == SEEDED)).first()
        audit.record(
            session=session,
            actor=actor,
            action="demo.remove",
            target="demo-fleet",
            reason="demo fleet removed",
            before={"events": num},
            after={"events": 0},
        )
        if seeded is None:
            session.add(ServiceMeta(key=SEEDED, value="removed"))
        session.commit()
    return num
