"""Approvals: with ``TURNOUT_REQUIRE_APPROVAL`` on, a change that sends more of a cohort to V2
(a flip that enables it or raises its share, a scheduled enable, a ramp) waits until a second
operator approves it; the requester cannot approve their own request (anyone may reject it).

A pending item is a ramp or a scheduled flip in ``pending_approval``; approving one applies it
in the same transaction (a ramp starts, a flip for now is made, a flip at a time is
scheduled), after checking that the cohort did not move since the request (its version).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard.store import audit, ramps, schedule, webhooks
from turnout.dashboard.store.errors import Conflict, NotAllowed, VersionConflict
from turnout.dashboard.store.models import Canary, utcnow
from turnout.dashboard.store.models_rollout import Ramp, ScheduledFlip

Subject = Literal["ramp", "flip"]


@dataclass(frozen=True)
class Pending:
    """One change waiting for approval, as the pages and the API list it."""

    subject: Subject
    id: int
    cohort: str
    summary: str  # "ramp 10 → 25 → 50 → 100 %", "enable at 50 %", "enable at 50 % at 14:00"
    reason: str
    requested_by: str
    requester: str
    requested_at: dt.datetime
    version: int


def _ramp_summary(r: Ramp) -> str:
    bakes = {s["bake_s"] for s in r.steps}
    bake = f", {bakes.pop() // 60} min each" if len(bakes) == 1 else ""
    return "ramp " + " → ".join(str(s["percentage"]) for s in r.steps) + f" %{bake}"


def _flip_summary(f: ScheduledFlip) -> str:
    what = (
        (f"enable at {f.percentage} %" if f.percentage is not None else "enable")
        if f.enabled
        else "disable"
    )
    return what + (f" at {f.run_at:%Y-%m-%d %H:%M} UTC" if f.run_at else " now")


def list_pending(*, session: Session) -> list[Pending]:
    """Oldest request first."""
    out = [
        Pending(
            "ramp",
            r.id,
            r.cohort,
            _ramp_summary(r),
            r.reason,
            r.requested_by,
            r.requester,
            r.requested_at,
            r.version,
        )
        for r in session.scalars(select(Ramp).where(Ramp.state == ramps.RampState.pending_approval))
    ]
    out += [
        Pending(
            "flip",
            f.id,
            f.cohort,
            _flip_summary(f),
            f.reason,
            f.requested_by,
            f.requester,
            f.requested_at,
            f.version,
        )
        for f in session.scalars(
            select(ScheduledFlip).where(ScheduledFlip.state == schedule.FlipState.pending_approval)
        )
    ]
    return sorted(out, key=lambda p: (p.requested_at, p.subject, p.id))


def _locked(
    session: Session, subject: Subject, item_id: int, if_version: int | None
) -> tuple[Canary, Ramp | ScheduledFlip]:
    if subject == "ramp":
        canary, ramp = ramps.lock(session, item_id)
        if if_version is not None and ramp.version != if_version:
            raise VersionConflict(
                f"ramp {item_id} is at version {ramp.version}, not {if_version}",
                current_version=ramp.version,
            )
        if ramp.state != ramps.RampState.pending_approval:
            raise Conflict(f"ramp {item_id} is {ramp.state}, not pending approval")
        return canary, ramp
    canary, flip = schedule.lock(session, item_id)
    schedule.check_open(flip, if_version, (schedule.FlipState.pending_approval,))
    return canary, flip


def _audit(
    session: Session,
    subject: Subject,
    item: Ramp | ScheduledFlip,
    action: str,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> None:
    entry = audit.record(
        session=session,
        actor=actor,
        action=f"{subject}.{action}",
        target=f"cohort:{item.cohort}",
        reason=reason,
        before={"requested_by": item.requested_by, "state": item.state},
        after={"id": item.id, "approved_by": item.approved_by},
        at=now,
    )
    webhooks.enqueue(
        session=session,
        kind=webhooks.Kind.approval,
        entry=entry,
        extra={"cohort": item.cohort, "subject": subject, "id": item.id, "decision": action},
    )


def approve(
    *,
    session: Session,
    subject: Subject,
    item_id: int,
    actor: str,
    approver: str,
    reason: str,
    if_version: int | None = None,
    now: dt.datetime | None = None,
) -> None:
    """Approve and apply a pending change. The caller commits.

    Raises:
        NotFound: no such item. NotAllowed: ``approver`` is its requester
            (``code=self_approval``). Conflict: not pending. InvalidChange: no reason.
        VersionConflict: ``if_version`` is not the item's, or the cohort moved since the
            request (reject it and ask again).
    """
    audit.require_reason(reason)
    now = now or utcnow()
    canary, item = _locked(session, subject, item_id, if_version)
    if approver == item.requester:
        raise NotAllowed(
            f"{subject} {item_id} was requested by {item.requested_by}: another "
            "operator must approve it"
        )
    cohort_version = item.if_version
    if cohort_version is not None and canary.version != cohort_version:
        raise VersionConflict(
            f"cohort {item.cohort!r} moved since the request (version {canary.version}, the "
            f"request read {cohort_version}): reject it and ask again",
            current_version=canary.version,
        )
    item.approved_by, item.approved_at = actor, now
    _audit(session, subject, item, "approve", actor, reason, now)
    item.version += 1
    if isinstance(item, Ramp):
        ramps.start(session=session, canary=canary, ramp=item, actor=actor, now=now)
    elif item.run_at is None:
        schedule.apply(
            session=session, canary=canary, flip=item, actor=actor, now=now, kind=webhooks.Kind.flip
        )
    else:
        item.state = schedule.FlipState.scheduled.value


def reject(
    *,
    session: Session,
    subject: Subject,
    item_id: int,
    actor: str,
    reason: str,
    if_version: int | None = None,
    now: dt.datetime | None = None,
) -> None:
    """Refuse a pending change (its requester may withdraw it so). The caller commits.
    Raises NotFound, Conflict (not pending), VersionConflict, InvalidChange (no reason)."""
    audit.require_reason(reason)
    now = now or utcnow()
    _canary, item = _locked(session, subject, item_id, if_version)
    _audit(session, subject, item, "reject", actor, reason, now)
    item.version += 1
    if isinstance(item, Ramp):
        item.state, item.ended_at, item.end_reason = (
            ramps.RampState.rejected.value,
            now,
            reason.strip(),
        )
    else:
        item.state, item.done_at, item.result = (
            schedule.FlipState.rejected.value,
            now,
            reason.strip(),
        )
