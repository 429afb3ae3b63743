"""Ramps: a cohort's canary taken through shares one after another (10 → 25 → 50 → 100 %), each
held for its bake time while the ramp's gates hold (``dashboard.store.advance`` moves them).

Every change locks the cohort's canary row first, then the ramp's (the order flips take too),
checks versions, and audits in the same transaction, with its webhook deliveries. A request
names the cohort's canary version it read (If-Match); a ramp change (cancel, resume) names the
ramp's version. At most one ramp per cohort is live: pending approval, active or paused.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard.gates import GateConfig
from turnout.dashboard.store import audit, canaries, webhooks
from turnout.dashboard.store.errors import Conflict, InvalidChange, NotFound, VersionConflict
from turnout.dashboard.store.models import Canary, utcnow
from turnout.dashboard.store.models_rollout import Ramp
from turnout.oracle.errors import ErrorCode

MAX_STEPS = 20
MAX_BAKE_S = 30 * 86_400


class RampState(StrEnum):
    pending_approval = "pending_approval"
    active = "active"
    paused = "paused"
    completed = "completed"
    cancelled = "cancelled"
    rolled_back = "rolled_back"
    rejected = "rejected"


LIVE = (RampState.pending_approval, RampState.active, RampState.paused)
ON_FAILURE = ("pause", "rollback")


def check_steps(steps: list[dict[str, Any]]) -> list[dict[str, int]]:
    """``[{"percentage": 10, "bake_s": 1800}, ...]``: 1 to 20 steps, shares in 1..100 rising
    strictly, bake times 0..30 days (seconds). Raises InvalidChange saying which step is
    wrong."""
    if not 1 <= len(steps) <= MAX_STEPS:
        raise InvalidChange(f"a ramp has 1 to {MAX_STEPS} steps, not {len(steps)}")
    out: list[dict[str, int]] = []
    for i, step in enumerate(steps, 1):
        share, bake = step.get("percentage"), step.get("bake_s")
        if not (isinstance(share, int) and 1 <= share <= 100):
            raise InvalidChange(
                f"step {i}: percentage {share!r} is not in 1..100", code=ErrorCode.BAD_PERCENTAGE
            )
        if not (isinstance(bake, int) and 0 <= bake <= MAX_BAKE_S):
            raise InvalidChange(f"step {i}: bake_s {bake!r} is not in 0..{MAX_BAKE_S}")
        if out and share <= out[-1]["percentage"]:
            raise InvalidChange(
                f"step {i}: {share}% does not rise above step {i - 1}'s {out[-1]['percentage']}%",
                code=ErrorCode.BAD_PERCENTAGE,
            )
        out.append({"percentage": share, "bake_s": bake})
    return out


def ramp_json(ramp: Ramp) -> dict[str, Any]:
    """A ramp's state for the audit log's before/after and the notifications."""
    return {
        "id": ramp.id,
        "state": ramp.state,
        "step_index": ramp.step_index,
        "percentage": (
            ramp.steps[ramp.step_index]["percentage"]
            if 0 <= ramp.step_index < len(ramp.steps)
            else None
        ),
        "steps": [s["percentage"] for s in ramp.steps],
        "version": ramp.version,
    }


def next_step_at(ramp: Ramp) -> dt.datetime | None:
    """When the current step's bake time ends (None before the start)."""
    if ramp.step_started_at is None or not 0 <= ramp.step_index < len(ramp.steps):
        return None
    return ramp.step_started_at + dt.timedelta(seconds=ramp.steps[ramp.step_index]["bake_s"])


def live_ramp(*, session: Session, cohort: str) -> Ramp | None:
    return session.scalars(
        select(Ramp).where(Ramp.cohort == cohort, Ramp.state.in_(LIVE)).order_by(Ramp.id.desc())
    ).first()


def list_ramps(
    *, session: Session, cohort: str | None = None, live_only: bool = False, limit: int = 100
) -> list[Ramp]:
    """Newest first."""
    stmt = select(Ramp).order_by(Ramp.id.desc()).limit(limit)
    if cohort is not None:
        stmt = stmt.where(Ramp.cohort == cohort)
    if live_only:
        stmt = stmt.where(Ramp.state.in_(LIVE))
    return list(session.scalars(stmt))


def latest_per_cohort(*, session: Session) -> dict[str, Ramp]:
    """Cohort → its latest ramp that ran or waits to (a rejected one never did), whatever its
    state: live, or how the last one ended (completed, cancelled, rolled back)."""
    from sqlalchemy import func

    latest = select(func.max(Ramp.id)).where(Ramp.state != RampState.rejected).group_by(Ramp.cohort)
    return {r.cohort: r for r in session.scalars(select(Ramp).where(Ramp.id.in_(latest)))}


def get_ramp(*, session: Session, ramp_id: int) -> Ramp:
    ramp = session.get(Ramp, ramp_id)
    if ramp is None:
        raise NotFound(f"no ramp {ramp_id}", code=ErrorCode.UNKNOWN_RAMP)
    return ramp


def lock(session: Session, ramp_id: int) -> tuple[Canary, Ramp]:
    """The ramp's cohort row and the ramp, both locked (cohort first) and read afresh.
    Raises NotFound."""
    ramp = get_ramp(session=session, ramp_id=ramp_id)
    canary = canaries.get_canary(session=session, cohort=ramp.cohort, for_update=True)
    fresh = canaries.locked(session, select(Ramp).where(Ramp.id == ramp_id))
    assert fresh is not None
    return canary, fresh


def _record(
    session: Session,
    ramp: Ramp,
    *,
    action: str,
    actor: str,
    reason: str,
    before: dict[str, Any] | None,
    now: dt.datetime,
    kind: webhooks.Kind,
    extra: dict[str, Any] | None = None,
) -> None:
    ramp.updated_at = now
    entry = audit.record(
        session=session,
        actor=actor,
        action=action,
        target=f"cohort:{ramp.cohort}",
        reason=reason,
        before=before,
        after=ramp_json(ramp),
        at=now,
    )
    webhooks.enqueue(
        session=session,
        kind=kind,
        entry=entry,
        extra={"cohort": ramp.cohort, "ramp_id": ramp.id, **(extra or {})},
    )


def request_ramp(
    *,
    session: Session,
    cohort: str,
    steps: list[dict[str, Any]],
    gates: GateConfig,
    on_failure: str,
    reason: str,
    actor: str,
    requester: str,
    if_version: int,
    needs_approval: bool,
    now: dt.datetime | None = None,
) -> Ramp:
    """Ask for a ramp of ``cohort``; with ``needs_approval`` it waits for a second operator
    (``pending_approval``), else its first step is applied now (the canary enabled at the
    first share). The caller commits.

    Raises:
        NotFound: unknown cohort. VersionConflict: ``if_version`` is not the cohort's.
        InvalidChange: bad steps or ``on_failure``, no reason.
        Conflict: a live ramp on the cohort (``code=ramp_exists``).
    """
    audit.require_reason(reason)
    checked = check_steps(steps)
    if on_failure not in ON_FAILURE:
        raise InvalidChange(f"on_failure {on_failure!r}: use pause or rollback")
    now = now or utcnow()
    canary = canaries.get_canary(session=session, cohort=cohort, for_update=True)
    _check_version(canary, if_version)
    existing = live_ramp(session=session, cohort=cohort)
    if existing is not None:
        raise Conflict(
            f"cohort {cohort!r} has a live ramp already (ramp {existing.id}, "
            f"{existing.state}): cancel it first",
            code=ErrorCode.RAMP_EXISTS,
        )
    ramp = Ramp(
        cohort=cohort,
        state=RampState.pending_approval.value,
        steps=checked,
        gates=gates.model_dump(),
        on_failure=on_failure,
        step_index=-1,
        if_version=if_version,
        version=1,
        reason=reason.strip(),
        requested_by=actor,
        requester=requester,
        requested_at=now,
        updated_at=now,
    )
    session.add(ramp)
    session.flush()
    if needs_approval:
        _record(
            session,
            ramp,
            action="ramp.request",
            actor=actor,
            reason=reason,
            before=None,
            now=now,
            kind=webhooks.Kind.approval,
        )
    else:
        start(session=session, canary=canary, ramp=ramp, actor=actor, now=now)
    return ramp


def _check_version(canary: Canary, if_version: int) -> None:
    if canary.version != if_version:
        raise VersionConflict(
            f"cohort {canary.cohort!r} is at version {canary.version}, not {if_version}: "
            "re-read it and decide again",
            current_version=canary.version,
        )


def start(*, session: Session, canary: Canary, ramp: Ramp, actor: str, now: dt.datetime) -> None:
    """Apply the first step of a ramp (both rows locked): the canary enabled at its share."""
    before = ramp_json(ramp)
    ramp.state, ramp.step_index = RampState.active.value, 0
    ramp.started_at = ramp.step_started_at = now
    ramp.version += 1
    canaries.set_state(
        canary, enabled=True, percentage=ramp.steps[0]["percentage"], actor=actor, at=now
    )
    _record(
        session,
        ramp,
        action="ramp.start",
        actor=actor,
        reason=ramp.reason,
        before=before,
        now=now,
        kind=webhooks.Kind.ramp_step,
        extra={"canary": canaries.canary_json(canary)},
    )


def step(
    *, session: Session, canary: Canary, ramp: Ramp, now: dt.datetime, gates: list[dict[str, Any]]
) -> None:
    """Move an active ramp to its next share, or complete it after its last step."""
    before = ramp_json(ramp)
    ramp.version += 1
    if ramp.step_index + 1 >= len(ramp.steps):
        ramp.state, ramp.ended_at = RampState.completed.value, now
        ramp.end_reason = "every step baked with its gates holding"
        _record(
            session,
            ramp,
            action="ramp.complete",
            actor="ramp",
            now=now,
            before=before,
            reason=f"ramp {ramp.id} complete at {canary.percentage}%",
            kind=webhooks.Kind.ramp_step,
            extra={"gates": gates},
        )
        return
    ramp.step_index += 1
    ramp.step_started_at = now
    share = ramp.steps[ramp.step_index]["percentage"]
    canaries.set_state(canary, enabled=True, percentage=share, actor="ramp", at=now)
    _record(
        session,
        ramp,
        action="ramp.step",
        actor="ramp",
        before=before,
        now=now,
        reason=f"ramp {ramp.id} step {ramp.step_index + 1}/{len(ramp.steps)}: {share}% "
        "(the previous step baked with every gate passing)",
        kind=webhooks.Kind.ramp_step,
        extra={"canary": canaries.canary_json(canary), "gates": gates},
    )


def fail(
    *,
    session: Session,
    canary: Canary,
    ramp: Ramp,
    now: dt.datetime,
    gates: list[dict[str, Any]],
    why: str,
    pause_only: bool = False,
) -> None:
    """A gate failed: pause the ramp, or end it and disable the cohort (``on_failure``;
    ``pause_only``: pause whatever it says, as an inconclusive PromQL gate does).
    ``why`` (the failing gates' messages) is cut to what an audit reason holds; ``gates`` and
    the ramp's ``last_gates`` keep every gate in full."""
    why = audit.clip_reason(why, "every gate in full in the ramp's last_gates")
    before = ramp_json(ramp)
    ramp.version += 1
    if ramp.on_failure == "rollback" and not pause_only:
        ramp.state, ramp.ended_at, ramp.end_reason = RampState.rolled_back.value, now, why
        canaries.set_state(canary, enabled=False, percentage=None, actor="ramp", at=now)
        action = "ramp.rollback"
    else:
        ramp.state = RampState.paused.value
        action = "ramp.pause"
    _record(
        session,
        ramp,
        action=action,
        actor="ramp",
        before=before,
        now=now,
        reason=why,
        kind=webhooks.Kind.gate_failure,
        extra={
            "canary": canaries.canary_json(canary),
            "gates": gates,
            "on_failure": ramp.on_failure,
        },
    )


def _locked_live(
    session: Session, ramp_id: int, if_version: int, states: tuple[RampState, ...]
) -> tuple[Canary, Ramp]:
    canary, ramp = lock(session, ramp_id)
    if ramp.version != if_version:
        raise VersionConflict(
            f"ramp {ramp_id} is at version {ramp.version}, not {if_version}",
            current_version=ramp.version,
        )
    if ramp.state not in states:
        raise Conflict(
            f"ramp {ramp_id} is {ramp.state}: only a {' or '.join(states)} ramp can be changed so"
        )
    return canary, ramp


def cancel_ramp(
    *,
    session: Session,
    ramp_id: int,
    actor: str,
    reason: str,
    if_version: int,
    now: dt.datetime | None = None,
) -> Ramp:
    """End a live ramp; the cohort keeps the share it has now. The caller commits.

    Raises NotFound, VersionConflict, InvalidChange (no reason), Conflict (not live)."""
    audit.require_reason(reason)
    now = now or utcnow()
    _canary, ramp = _locked_live(session, ramp_id, if_version, LIVE)
    before = ramp_json(ramp)
    ramp.state, ramp.ended_at, ramp.end_reason = RampState.cancelled.value, now, reason.strip()
    ramp.version += 1
    _record(
        session,
        ramp,
        action="ramp.cancel",
        actor=actor,
        reason=reason,
        before=before,
        now=now,
        kind=webhooks.Kind.ramp_step,
    )
    return ramp


def resume_ramp(
    *,
    session: Session,
    ramp_id: int,
    actor: str,
    reason: str,
    if_version: int,
    now: dt.datetime | None = None,
) -> Ramp:
    """Resume a paused ramp: its current step bakes again from now. The caller commits.

    Raises NotFound, VersionConflict, InvalidChange (no reason), Conflict (not paused)."""
    audit.require_reason(reason)
    now = now or utcnow()
    _canary, ramp = _locked_live(session, ramp_id, if_version, (RampState.paused,))
    before = ramp_json(ramp)
    ramp.state, ramp.step_started_at = RampState.active.value, now
    ramp.version += 1
    _record(
        session,
        ramp,
        action="ramp.resume",
        actor=actor,
        reason=reason,
        before=before,
        now=now,
        kind=webhooks.Kind.ramp_step,
    )
    return ramp


def supersede(*, session: Session, cohort: str, actor: str, now: dt.datetime, why: str) -> None:
    """End the cohort's live ramp, if any, because the cohort was flipped another way (its
    canary row is locked by the caller)."""
    ramp = live_ramp(session=session, cohort=cohort)
    if ramp is None:
        return
    why = audit.clip_reason(why)  # quotes the flip's reason, which may be as long as allowed
    before = ramp_json(ramp)
    ramp.state, ramp.ended_at, ramp.end_reason = RampState.cancelled.value, now, why
    ramp.version += 1
    _record(
        session,
        ramp,
        action="ramp.cancel",
        actor=actor,
        reason=why,
        before=before,
        now=now,
        kind=webhooks.Kind.ramp_step,
    )


def v2_reach(*, session: Session, since: dt.datetime) -> tuple[int, int]:
    """Deployments whose latest decision is V2, made (before, since) ``since`` (the kill
    switch's engagement): the first still run V2 until they restart, the second are pinned."""
    from sqlalchemy import case, func

    from turnout.dashboard.store.models import Deployment

    before = func.sum(case((Deployment.at < since, 1), else_=0))
    after = func.sum(case((Deployment.at >= since, 1), else_=0))
    row = session.execute(select(before, after).where(Deployment.runner == "v2")).one()
    return int(row[0] or 0), int(row[1] or 0)


def v2_engines_reporting(*, session: Session, since: dt.datetime) -> int:
    """Engines (deployment ids) whose latest health report whose window ended at or after
    ``since`` says V2: running V2 now, whatever their decision says."""
    from sqlalchemy import and_, func

    from turnout.dashboard.store.health import epoch_s
    from turnout.dashboard.store.models import EngineHealth as H

    latest = (
        select(H.deployment_id, func.max(H.end_s).label("end_s"))
        .where(H.end_s >= epoch_s(since))
        .group_by(H.deployment_id)
        .subquery()
    )
    stmt = (
        select(func.count(H.deployment_id.distinct()))
        .join(latest, and_(H.deployment_id == latest.c.deployment_id, H.end_s == latest.c.end_s))
        .where(H.runner == "v2")
    )
    return int(session.scalar(stmt) or 0)
