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
from turnout.dashboard.gates import (
    Evidence,
    GateConfig,
    GateResult,
    PromqlReading,
    RunnerHealthLike,
)
from turnout.dashboard.store import audit, canaries, evidence, history, ramps
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
    promql: Mapping[str, PromqlReading] | None = None,
) -> list[GateResult]:
    """Every gate of an active ramp at ``now``: V2's health since its step started, V1's since
    the ramp started, both in the ramp's cohort (unless its gates leave health reports out),
    and its PromQL gates from ``promql`` (gate name → what Prometheus answered; a gate
    missing there reads as unanswered)."""
    config = GateConfig.model_validate(ramp.gates)
    engaged = canaries.get_kill_switch(session=session).engaged
    assert ramp.step_started_at is not None and ramp.started_at is not None
    results = [
        gates.kill_switch_gate(engaged),
        gates.evidence_gate(
            stage_families(session, ramp.cohort, named), _latest_evidence(session), now, config
        ),
    ]
    if config.health_reports:
        v2 = health(session, stage=ramp.cohort, since=ramp.step_started_at, until=now).get("v2")
        v1 = health(session, stage=ramp.cohort, since=ramp.started_at, until=now).get("v1")
        results += gates.health_gates(v1, v2, config)
    for gate in config.promql:
        name = f"promql:{gate.name}"
        reading = (promql or {}).get(gate.name) or PromqlReading(
            gate.render(ramp.cohort), None, "not queried this round", now
        )
        before = gates.inconclusive_rounds(ramp.last_gates, name)
        results.append(gates.promql_gate(gate, reading, before, config))
    return results


def _audit_promql_changes(
    session: Session, ramp: Ramp, results: list[GateResult], now: dt.datetime
) -> None:
    """An audit entry for each PromQL gate whose verdict differs from the last round's (its
    query, value and verdict): the log shows when Prometheus' view of the canary turned,
    without an entry per tick."""
    previous = {
        g.get("gate"): g.get("status") for g in ramp.last_gates or () if isinstance(g, dict)
    }
    for r in results:
        if not r.gate.startswith("promql:") or previous.get(r.gate) == r.status:
            continue
        audit.record(
            session=session,
            actor="ramp",
            action="ramp.gate",
            target=f"cohort:{ramp.cohort}",
            reason=audit.clip_reason(r.message, "the query in full in the entry's after"),
            before={"gate": r.gate, "status": previous.get(r.gate)},
            after={"ramp_id": ramp.id, **r.to_json()},
            at=now,
        )


def advance_ramp(
    *,
    session: Session,
    ramp_id: int,
    seen_version: int,
    now: dt.datetime,
    named: Mapping[str, tuple[str, ...]],
    health: HealthReader,
    promql: Mapping[str, PromqlReading] | None = None,
) -> RampTick:
    """Evaluate one ramp's gates and act: fail → pause or roll back (an inconclusive PromQL
    gate's failure only pauses); every gate passing and the step's bake time over → the
    next step (or completion); otherwise hold. Commits."""
    canary, ramp = ramps.lock(session, ramp_id)
    if ramp.version != seen_version or ramp.state != ramps.RampState.active:
        session.rollback()
        return RampTick(ramp_id, ramp.cohort, "skipped")
    results = evaluate(session, ramp, now, named, health, promql)
    _audit_promql_changes(session, ramp, results, now)
    as_json = [r.to_json() for r in results]
    ramp.last_gates, ramp.last_checked_at = as_json, now
    status = gates.outcome(results)
    due = ramps.next_step_at(ramp)
    outcome: Outcome = "held"
    if status == "fail":
        failed = [r for r in results if r.status == "fail"]
        why = "; ".join(r.message for r in failed)
        pause_only = all(r.figures.get("inconclusive") for r in failed)
        ramps.fail(
            session=session,
            canary=canary,
            ramp=ramp,
            now=now,
            gates=as_json,
            why=why,
            pause_only=pause_only,
        )
        rolled_back = ramp.on_failure == "rollback" and not pause_only
        outcome = "rolled_back" if rolled_back else "paused"
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
    promql: Mapping[int, Mapping[str, PromqlReading]] | None = None,
) -> list[RampTick]:
    """One pass over every active ramp at ``now`` (``named``: cohort → the families its
    stage names, ``Policy.cohort_families()``; ``health``: the health reader; ``promql``:
    ramp id → its PromQL gates' readings, asked before the pass: ``dashboard/promql.py``).
    Commits each ramp's outcome on its own; ``session`` is a write session."""
    listed = session.execute(
        select(Ramp.id, Ramp.version).where(Ramp.state == ramps.RampState.active).order_by(Ramp.id)
    ).all()
    session.rollback()  # the list is a read: each ramp is locked in its own transaction
    return [
        advance_ramp(
            session=session,
            ramp_id=i,
            seen_version=v,
            now=now,
            named=named,
            health=health,
            promql=(promql or {}).get(i),
        )
        for i, v in listed
    ]
