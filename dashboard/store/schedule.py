"""Scheduled flips, and flips that wait for a second operator's approval.

A flip asked for at a time (``run_at``) waits in ``scheduled`` until :func:`run_scheduled`
finds it due; one that needs approval waits in ``pending_approval`` first (an immediate one,
``run_at`` None, is applied by the approval itself). Each change locks the cohort's canary
row, then the flip's, and audits with its webhook deliveries in the same transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard.store import audit, canaries, webhooks
from turnout.dashboard.store.canaries import Flip
from turnout.dashboard.store.errors import Conflict, InvalidChange, NotFound, VersionConflict
from turnout.dashboard.store.models import Canary, utcnow
from turnout.dashboard.store.models_rollout import ScheduledFlip
from turnout.oracle.errors import ErrorCode

MAX_AHEAD = dt.timedelta(days=366)


class FlipState(StrEnum):
    pending_approval = "pending_approval"
    scheduled = "scheduled"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"
    rejected = "rejected"


OPEN = (FlipState.pending_approval, FlipState.scheduled)


def raises_share(canary: Canary, enabled: bool, percentage: int | None) -> bool:
    """Whether a flip sends more of the cohort to V2: enabling it, or a larger share of an
    enabled one (what an approval is asked for)."""
    if not enabled:
        return False
    share = canary.percentage if percentage is None else percentage
    return not canary.enabled or share > canary.percentage


def flip_json(flip: ScheduledFlip) -> dict[str, object]:
    return {
        "id": flip.id,
        "cohort": flip.cohort,
        "enabled": flip.enabled,
        "percentage": flip.percentage,
        "state": flip.state,
        "run_at": flip.run_at.isoformat() if flip.run_at else None,
        "version": flip.version,
    }


def _record(
    session: Session,
    flip: ScheduledFlip,
    *,
    action: str,
    actor: str,
    reason: str,
    before: dict[str, object] | None,
    now: dt.datetime,
    kind: webhooks.Kind,
) -> None:
    entry = audit.record(
        session=session,
        actor=actor,
        action=action,
        target=f"cohort:{flip.cohort}",
        reason=reason,
        before=before,
        after=flip_json(flip),
        at=now,
    )
    webhooks.enqueue(
        session=session, kind=kind, entry=entry, extra={"cohort": flip.cohort, "flip_id": flip.id}
    )


def request_flip(
    *,
    session: Session,
    cohort: str,
    enabled: bool,
    percentage: int | None,
    reason: str,
    actor: str,
    requester: str,
    run_at: dt.datetime | None,
    if_version: int | None,
    needs_approval: bool,
    now: dt.datetime | None = None,
) -> ScheduledFlip:
    """Schedule a flip at ``run_at``, or (``run_at`` None) ask for one now that waits for an
    approval. The caller commits.

    Raises:
        NotFound: unknown cohort. VersionConflict: ``if_version`` given and not the cohort's.
        InvalidChange: no reason, a share outside 0..100, ``run_at`` not in the future (or
            more than a year ahead), an immediate flip that needs no approval.
    """
    audit.require_reason(reason)
    now = now or utcnow()
    if percentage is not None and not 0 <= percentage <= 100:
        raise InvalidChange(
            f"percentage {percentage} is outside 0..100", code=ErrorCode.BAD_PERCENTAGE
        )
    if run_at is None and not needs_approval:
        raise InvalidChange("a flip for now that needs no approval is a flip: use PATCH")
    if run_at is not None and not now < run_at <= now + MAX_AHEAD:
        raise InvalidChange(
            f"run_at {run_at.isoformat()} is not between now "
            f"({now.isoformat(timespec='seconds')}) and a year ahead"
        )
    canary = canaries.get_canary(session=session, cohort=cohort, for_update=True)
    if if_version is not None and canary.version != if_version:
        raise VersionConflict(
            f"cohort {cohort!r} is at version {canary.version}, not "
            f"{if_version}: re-read it and decide again",
            current_version=canary.version,
        )
    state = FlipState.pending_approval if needs_approval else FlipState.scheduled
    flip = ScheduledFlip(
        cohort=cohort,
        enabled=enabled,
        percentage=percentage,
        run_at=run_at,
        if_version=if_version,
        state=state.value,
        version=1,
        reason=reason.strip(),
        requested_by=actor,
        requester=requester,
        requested_at=now,
    )
    session.add(flip)
    session.flush()
    kind = webhooks.Kind.approval if needs_approval else webhooks.Kind.scheduled_flip
    action = "flip.request" if needs_approval else "flip.schedule"
    _record(
        session, flip, action=action, actor=actor, reason=reason, before=None, now=now, kind=kind
    )
    return flip


def get_flip(*, session: Session, flip_id: int) -> ScheduledFlip:
    flip = session.get(ScheduledFlip, flip_id)
    if flip is None:
        raise NotFound(f"no scheduled flip {flip_id}", code=ErrorCode.UNKNOWN_FLIP)
    return flip


def lock(session: Session, flip_id: int) -> tuple[Canary, ScheduledFlip]:
    """The flip's cohort row and the flip, both locked (cohort first), read afresh."""
    flip = get_flip(session=session, flip_id=flip_id)
    canary = canaries.get_canary(session=session, cohort=flip.cohort, for_update=True)
    fresh = canaries.locked(session, select(ScheduledFlip).where(ScheduledFlip.id == flip_id))
    assert fresh is not None
    return canary, fresh


def list_flips(
    *, session: Session, open_only: bool = False, limit: int = 100
) -> list[ScheduledFlip]:
    """Open ones by due time first, then newest."""
    stmt = select(ScheduledFlip).order_by(ScheduledFlip.id.desc()).limit(limit)
    if open_only:
        stmt = stmt.where(ScheduledFlip.state.in_(OPEN))
    return list(session.scalars(stmt))


def cancel_flip(
    *,
    session: Session,
    flip_id: int,
    actor: str,
    reason: str,
    if_version: int,
    now: dt.datetime | None = None,
) -> ScheduledFlip:
    """Cancel an open flip. Raises NotFound, VersionConflict, InvalidChange (no reason),
    Conflict (it already ran or ended)."""
    audit.require_reason(reason)
    now = now or utcnow()
    _canary, flip = lock(session, flip_id)
    check_open(flip, if_version, OPEN)
    before = flip_json(flip)
    flip.state, flip.done_at, flip.result = FlipState.cancelled.value, now, reason.strip()
    flip.version += 1
    _record(
        session,
        flip,
        action="flip.cancel",
        actor=actor,
        reason=reason,
        before=before,
        now=now,
        kind=webhooks.Kind.scheduled_flip,
    )
    return flip


def check_open(flip: ScheduledFlip, if_version: int | None, states: tuple[FlipState, ...]) -> None:
    if if_version is not None and flip.version != if_version:
        raise VersionConflict(
            f"scheduled flip {flip.id} is at version {flip.version}, not {if_version}",
            current_version=flip.version,
        )
    if flip.state not in states:
        raise Conflict(
            f"scheduled flip {flip.id} is {flip.state}: only a "
            f"{' or '.join(states)} flip can be changed so"
        )


def apply(
    *,
    session: Session,
    canary: Canary,
    flip: ScheduledFlip,
    actor: str,
    now: dt.datetime,
    kind: webhooks.Kind,
) -> Flip | None:
    """Apply a flip (both rows locked): done, or failed when it asked for a cohort version
    that is no longer current (None then). Does not commit."""
    version = canary.version if flip.if_version is None else flip.if_version
    flip.version += 1
    flip.done_at = now
    try:
        result = canaries.flip_canary(
            session=session,
            cohort=flip.cohort,
            enabled=flip.enabled,
            percentage=flip.percentage,
            reason=flip.reason,
            actor=actor,
            if_version=version,
            kind=kind,
        )
    except VersionConflict as err:
        flip.state, flip.result = FlipState.failed.value, str(err)
        _record(
            session,
            flip,
            action="flip.fail",
            actor=actor,
            reason=str(err),
            before=None,
            now=now,
            kind=webhooks.Kind.scheduled_flip,
        )
        return None
    flip.state = FlipState.done.value
    flip.result = "applied" if result.changed else "the cohort had that state already"
    if not result.changed:  # no canary.flip entry says it ran: this one does
        _record(
            session,
            flip,
            action="flip.done",
            actor=actor,
            reason=flip.result,
            before=None,
            now=now,
            kind=webhooks.Kind.scheduled_flip,
        )
    return result


def flip_or_request(
    *,
    session: Session,
    cohort: str,
    enabled: bool,
    percentage: int | None,
    reason: str,
    actor: str,
    requester: str,
    if_version: int,
    require_approval: bool,
) -> Flip | ScheduledFlip:
    """A flip now (:func:`canaries.flip_canary`), or, when approvals are required and it
    sends more of the cohort to V2 (:func:`raises_share`), a pending flip for now that waits
    for another operator. Raises as those two do."""
    if require_approval:
        canary = canaries.get_canary(session=session, cohort=cohort, for_update=True)
        if raises_share(canary, enabled, percentage):
            return request_flip(
                session=session,
                cohort=cohort,
                enabled=enabled,
                percentage=percentage,
                reason=reason,
                actor=actor,
                requester=requester,
                run_at=None,
                if_version=if_version,
                needs_approval=True,
            )
    return canaries.flip_canary(
        session=session,
        cohort=cohort,
        enabled=enabled,
        percentage=percentage,
        reason=reason,
        actor=actor,
        if_version=if_version,
    )


@dataclass(frozen=True)
class FlipRun:
    flip_id: int
    cohort: str
    applied: bool
    changed: bool


def run_scheduled(*, session: Session, now: dt.datetime) -> list[FlipRun]:
    """Apply every scheduled flip due at ``now`` (oldest due first), each in a transaction of
    its own (committed); a flip another replica ran meanwhile is left alone."""
    due = list(
        session.scalars(
            select(ScheduledFlip.id)
            .where(ScheduledFlip.state == FlipState.scheduled, ScheduledFlip.run_at <= now)
            .order_by(ScheduledFlip.run_at, ScheduledFlip.id)
        )
    )
    session.rollback()
    out = []
    for flip_id in due:
        canary, flip = lock(session, flip_id)
        if flip.state != FlipState.scheduled:
            session.rollback()
            continue
        result = apply(
            session=session,
            canary=canary,
            flip=flip,
            now=now,
            actor=f"schedule (flip {flip.id} by {flip.requested_by})"[:128],
            kind=webhooks.Kind.scheduled_flip,
        )
        session.commit()
        out.append(
            FlipRun(flip_id, flip.cohort, result is not None, bool(result and result.changed))
        )
    return out
