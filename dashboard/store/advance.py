"""Advancing ramps: one pass at an explicit time ``now`` (the service's ticker calls it every
few seconds; tests call it with the times they choose).

Each active ramp is handled in a transaction of its own: its cohort's canary row and the ramp
are locked (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's write transactions are
exclusive), and the ramp's version must still be the one the pass listed. A replica that
listed it before another one moved it finds another version and leaves it: a step is taken
once, however many replicas tick at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard import gates
from turnout.dashboard.gates import Evidence, GateConfig, GateResult, RunnerHealthLike
from turnout.dashboard.store import canaries, evidence, history, ramps
from turnout.dashboard.store.models_rollout import Ramp

Outcome = Literal["stepped", "completed", "paused", "rolled_back", "held", "skipped"]


class HealthReader(Protocol):
    """``dashboard.store.health.health_by_runner``: runner → its health in a stage over
    [since, until)."""

    def __call__(
        self, session: Session, *, stage: str, since: dt.datetime, until: dt.datetime | None = None
    ) -> Mapping[str, RunnerHealthLike]: ...


@dataclass(frozen=True)
class RampTick:
    """What a pass did to one ramp, and the gates it read."""

    ramp_id: int
    cohort: str
    outcome: Outcome
    gates: tuple[GateResult, ...] = ()


def stage_families(
    session: Session, cohort: str, named: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """The families of a stage: those its rollout.yaml entry names, else (a stage that takes
    deployments by their attributes) those of the fleet's deployments in it."""
    if named.get(cohort):
        return named[cohort]
    return tuple(sorted(history.families_by_stage(session=session).get(cohort, ())))


def _latest_evidence(session: Session) -> dict[str, Evidence]:
    return {
        f: Evidence(f, e.result, e.recorded_at, e.suite, e.num_failures, e.num_errors, e.num_tests)
        for f, e in evidence.latest_per_family(session=session).items()
    }


def evaluate(
    session: Session,
    ramp: Ramp,
    now: dt.datetime,
    named: Mapping[str, tuple[str, ...]],
    health: HealthReader,
) -> list[GateResult]:
    """Every gate of an active ramp at ``now``: V2's health since its step started, V1's since
    the ramp started, both in the ramp's cohort."""
    config = GateConfig.model_validate(ramp.gates)
    engaged = canaries.get_kill_switch(session=session).engaged
    assert ramp.step_started_at is not None and ramp.started_at is not None
    v2 = health(session, stage=ramp.cohort, since=ramp.step_started_at, until=now).get("v2")
    v1 = health(session, stage=ramp.cohort, since=ramp.started_at, until=now).get("v1")
    return [
        gates.kill_switch_gate(engaged),
        gates.evidence_gate(
            stage_families(session, ramp.cohort, named), _latest_evidence(session), now, config
        ),
        *gates.health_gates(v1, v2, config),
    ]


def advance_ramp(
    *,
    session: Session,
    ramp_id: int,
    seen_version: int,
    now: dt.datetime,
    named: Mapping[str, tuple[str, ...]],
    health: HealthReader,
) -> RampTick:
    """Evaluate one ramp's gates and act: fail → pause or roll back; every gate passing and
    the step's bake time over → the next step (or completion); otherwise hold. Commits."""
    canary, ramp = ramps.lock(session, ramp_id)
    if ramp.version != seen_version or ramp.state != ramps.RampState.active:
        session.rollback()
        return RampTick(ramp_id, ramp.cohort, "skipped")
    results = evaluate(session, ramp, now, named, health)
    as_json = [r.to_json() for r in results]
    ramp.last_gates, ramp.last_checked_at = as_json, now
    status = gates.outcome(results)
    due = ramps.next_step_at(ramp)
    outcome: Outcome = "held"
    if status == "fail":
        why = "; ".join(r.message for r in results if r.status == "fail")
        ramps.fail(session=session, canary=canary, ramp=ramp, now=now, gates=as_json, why=why)
        outcome = "rolled_back" if ramp.on_failure == "rollback" else "paused"
    elif status == "pass" and due is not None and now >= due:
        ramps.step(session=session, canary=canary, ramp=ramp, now=now, gates=as_json)
        outcome = "completed" if ramp.state == ramps.RampState.completed else "stepped"
    session.commit()
    return RampTick(ramp_id, ramp.cohort, outcome, tuple(results))


def advance_ramps(
    *,
    session: Session,
    now: dt.datetime,
    named: Mapping[str, tuple[str, ...]],
    health: HealthReader,
) -> list[RampTick]:
    """One pass over every active ramp at ``now`` (``named``: cohort → the families its
    stage names, ``Policy.cohort_families()``; ``health``: the health reader). Commits each
    ramp's outcome on its own; ``session`` is a write session."""
    listed = session.execute(
        select(Ramp.id, Ramp.version).where(Ramp.state == ramps.RampState.active).order_by(Ramp.id)
    ).all()
    session.rollback()  # the list is a read: each ramp is locked in its own transaction
    return [
        advance_ramp(
            session=session, ramp_id=i, seen_version=v, now=now, named=named, health=health
        )
        for i, v in listed
    ]
