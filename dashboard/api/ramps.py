"""Ramps (start with If-Match on the cohort, cancel and resume with If-Match on the ramp),
scheduled flips, approvals."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from turnout.dashboard.api.rollout import parse_if_match, raise_cohort_error
from turnout.dashboard.api.schemas import ErrorResponse
from turnout.dashboard.api.schemas_rollout import (
    PendingOut,
    RampIn,
    RampOut,
    ReasonIn,
    ScheduledFlipIn,
    ScheduledFlipOut,
)
from turnout.dashboard.auth import Principal
from turnout.dashboard.bodies import JsonRoute
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    MAX_BODY,
    MAX_ID,
    OperatorDep,
    ReadSessionDep,
    ServicesDep,
    ViewerDep,
    WriteSessionDep,
    known_query,
    raise_store_error,
)
from turnout.dashboard.gates import GateConfig
from turnout.dashboard.services import Services
from turnout.dashboard.store import approvals, ramps, schedule
from turnout.dashboard.store.errors import StoreError
from turnout.dashboard.store.models_rollout import Ramp, ScheduledFlip

router = APIRouter(
    tags=["ramps"],
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
CHANGE_ERRORS: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorResponse},
    409: {"model": ErrorResponse},
    428: {"model": ErrorResponse},
}
# What a change of a ramp or a flip sends as If-Match, and where an operator reads it.
RAMP_VERSION = "the ramp's version (the ETag of GET /api/v1/ramps/{ramp_id})"
FLIP_VERSION = "the flip's version (its version in GET /api/v1/scheduled-flips)"


def ramp_out(ramp: Ramp) -> RampOut:
    share = (
        ramp.steps[ramp.step_index]["percentage"]
        if 0 <= ramp.step_index < len(ramp.steps)
        else None
    )
    return RampOut(
        id=ramp.id,
        cohort=ramp.cohort,
        state=ramp.state,
        steps=ramp.steps,  # type: ignore[arg-type]
        gates=GateConfig.model_validate(ramp.gates),
        on_failure=ramp.on_failure,
        step_index=ramp.step_index,
        percentage=share,
        step_started_at=ramp.step_started_at,
        next_step_at=ramps.next_step_at(ramp),
        started_at=ramp.started_at,
        version=ramp.version,
        reason=ramp.reason,
        requested_by=ramp.requested_by,
        requested_at=ramp.requested_at,
        approved_by=ramp.approved_by,
        approved_at=ramp.approved_at,
        last_gates=ramp.last_gates or [],  # type: ignore[arg-type]
        last_checked_at=ramp.last_checked_at,
        ended_at=ramp.ended_at,
        end_reason=ramp.end_reason,
    )


def flip_out(flip: ScheduledFlip) -> ScheduledFlipOut:
    return ScheduledFlipOut.model_validate(flip, from_attributes=True)


def gate_config(services: Services, given: GateConfig | None) -> GateConfig:
    """The service's default thresholds with the fields the request set."""
    defaults = services.settings.ramp_gates
    if given is None:
        return defaults
    return GateConfig.model_validate(
        {**defaults.model_dump(), **given.model_dump(include=given.model_fields_set)}
    )


@router.get("/ramps", response_model=list[RampOut])
def get_ramps(
    session: ReadSessionDep,
    _who: ViewerDep,
    cohort: Annotated[str | None, Query(max_length=64)] = None,
    live: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[RampOut]:
    """Ramps, newest first (``live``: only those pending approval, active or paused)."""
    rows = ramps.list_ramps(session=session, cohort=cohort, live_only=live, limit=limit)
    return [ramp_out(r) for r in rows]


@router.get("/ramps/{ramp_id}", response_model=RampOut, responses={404: {"model": ErrorResponse}})
def get_ramp(
    ramp_id: IdPath, session: ReadSessionDep, _who: ViewerDep, response: Response
) -> RampOut:
    """One ramp with its gates' last figures; its ETag is the version for If-Match."""
    try:
        ramp = ramps.get_ramp(session=session, ramp_id=ramp_id)
    except StoreError as err:
        raise_store_error(err)
    response.headers["ETag"] = f'"{ramp.version}"'
    return ramp_out(ramp)


@router.post(
    "/canaries/{cohort}/ramp",
    response_model=RampOut,
    status_code=201,
    responses={**CHANGE_ERRORS, 202: {"model": RampOut, "description": "waiting for approval"}},
)
def post_ramp(
    cohort: str,
    body: RampIn,
    services: ServicesDep,
    session: WriteSessionDep,
    who: OperatorDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> RampOut | JSONResponse:
    """Start a ramp of the cohort (operator); ``If-Match`` carries the cohort's version. The
    first step applies now (201), or once another operator approves it (202, when the
    service requires approvals). A cohort with a live ramp is a 409 ``ramp_exists``."""
    version = parse_if_match(if_match)
    try:
        ramp = ramps.request_ramp(
            session=session,
            cohort=cohort,
            steps=[s.model_dump() for s in body.steps],
            gates=gate_config(services, body.gates),
            on_failure=body.on_failure,
            reason=body.reason,
            actor=who.actor,
            requester=who.name,
            if_version=version,
            needs_approval=services.require_approval(),
        )
        session.commit()
    except StoreError as err:
        raise_cohort_error(services, cohort, err)
    if ramp.state == ramps.RampState.active:
        services.policy.invalidate()
    out = ramp_out(ramp)
    headers = {"ETag": f'"{ramp.version}"'}
    if ramp.state == ramps.RampState.pending_approval:
        return JSONResponse(out.model_dump(mode="json"), status_code=202, headers=headers)
    response.headers.update(headers)
    return out


def _ramp_change(
    what: Literal["cancel", "resume"],
    ramp_id: int,
    body: ReasonIn,
    services: Services,
    session: Session,
    who: Principal,
    if_match: str | None,
    response: Response,
) -> RampOut:
    version = parse_if_match(if_match, RAMP_VERSION)
    change = ramps.cancel_ramp if what == "cancel" else ramps.resume_ramp
    try:
        ramp = change(
            session=session,
            ramp_id=ramp_id,
            actor=who.actor,
            reason=body.reason,
            if_version=version,
        )
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    response.headers["ETag"] = f'"{ramp.version}"'
    return ramp_out(ramp)


@router.post("/ramps/{ramp_id}/cancel", response_model=RampOut, responses=CHANGE_ERRORS)
def cancel_ramp(
    ramp_id: IdPath,
    body: ReasonIn,
    services: ServicesDep,
    session: WriteSessionDep,
    who: OperatorDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> RampOut:
    """End a live ramp (operator; ``If-Match``: the ramp's version); the cohort keeps the
    share it has now."""
    return _ramp_change("cancel", ramp_id, body, services, session, who, if_match, response)


@router.post("/ramps/{ramp_id}/resume", response_model=RampOut, responses=CHANGE_ERRORS)
def resume_ramp(
    ramp_id: IdPath,
    body: ReasonIn,
    services: ServicesDep,
    session: WriteSessionDep,
    who: OperatorDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> RampOut:
    """Resume a paused ramp (operator; ``If-Match``: the ramp's version): its step bakes
    again from now, and the gates are read again at the next tick."""
    return _ramp_change("resume", ramp_id, body, services, session, who, if_match, response)


@router.get("/scheduled-flips", response_model=list[ScheduledFlipOut])
def get_scheduled_flips(
    session: ReadSessionDep,
    _who: ViewerDep,
    open: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[ScheduledFlipOut]:
    """Scheduled flips, newest first (``open``: pending approval or scheduled only)."""
    return [flip_out(f) for f in schedule.list_flips(session=session, open_only=open, limit=limit)]


@router.post(
    "/scheduled-flips",
    response_model=ScheduledFlipOut,
    status_code=201,
    responses={
        404: {"model": ErrorResponse},
        202: {"model": ScheduledFlipOut, "description": "waiting for approval"},
    },
)
def post_scheduled_flip(
    body: ScheduledFlipIn, services: ServicesDep, session: WriteSessionDep, who: OperatorDep
) -> ScheduledFlipOut | JSONResponse:
    """Schedule a flip at ``run_at`` (operator); an enable waits for approval first when the
    service requires approvals (202)."""
    try:
        flip = schedule.request_flip(
            session=session,
            cohort=body.cohort,
            enabled=body.enabled,
            percentage=body.percentage,
            reason=body.reason,
            actor=who.actor,
            requester=who.name,
            run_at=body.run_at,
            if_version=None,
            needs_approval=services.require_approval() and body.enabled,
        )
        session.commit()
    except StoreError as err:
        raise_cohort_error(services, body.cohort, err)
    if flip.state == schedule.FlipState.pending_approval:
        return JSONResponse(flip_out(flip).model_dump(mode="json"), status_code=202)
    return flip_out(flip)


@router.post(
    "/scheduled-flips/{flip_id}/cancel", response_model=ScheduledFlipOut, responses=CHANGE_ERRORS
)
def cancel_scheduled_flip(
    flip_id: IdPath,
    body: ReasonIn,
    session: WriteSessionDep,
    who: OperatorDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> ScheduledFlipOut:
    """Cancel a flip that has not run (operator; ``If-Match``: the flip's version)."""
    version = parse_if_match(if_match, FLIP_VERSION)
    try:
        flip = schedule.cancel_flip(
            session=session,
            flip_id=flip_id,
            actor=who.actor,
            reason=body.reason,
            if_version=version,
        )
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    response.headers["ETag"] = f'"{flip.version}"'
    return flip_out(flip)


@router.get("/approvals", response_model=list[PendingOut])
def get_approvals(session: ReadSessionDep, _who: ViewerDep) -> list[PendingOut]:
    """Changes waiting for a second operator, oldest first."""
    return [
        PendingOut(
            subject=p.subject,
            id=p.id,
            cohort=p.cohort,
            summary=p.summary,
            reason=p.reason,
            requested_by=p.requested_by,
            requested_at=p.requested_at,
            version=p.version,
        )
        for p in approvals.list_pending(session=session)
    ]


SubjectPath = Annotated[Literal["ramp", "flip"], Path(description="ramp or flip")]


def _decide(
    decision: Literal["approve", "reject"],
    subject: Literal["ramp", "flip"],
    item_id: int,
    body: ReasonIn,
    services: Services,
    session: Session,
    who: Principal,
    if_match: str | None,
) -> Response:
    version = parse_if_match(if_match) if if_match is not None else None
    try:
        if decision == "approve":
            approvals.approve(
                session=session,
                subject=subject,
                item_id=item_id,
                actor=who.actor,
                approver=who.name,
                reason=body.reason,
                if_version=version,
            )
        else:
            approvals.reject(
                session=session,
                subject=subject,
                item_id=item_id,
                actor=who.actor,
                reason=body.reason,
                if_version=version,
            )
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    services.policy.invalidate()
    if subject == "ramp":
        return JSONResponse(
            ramp_out(ramps.get_ramp(session=session, ramp_id=item_id)).model_dump(mode="json")
        )
    return JSONResponse(
        flip_out(schedule.get_flip(session=session, flip_id=item_id)).model_dump(mode="json")
    )


DECIDE_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"description": "the ramp (RampOut) or flip (ScheduledFlipOut) after the decision"},
    403: {"model": ErrorResponse},
    404: {"model": ErrorResponse},
    409: {"model": ErrorResponse},
}


@router.post("/approvals/{subject}/{item_id}/approve", responses=DECIDE_RESPONSES)
def approve(
    subject: SubjectPath,
    item_id: IdPath,
    body: ReasonIn,
    services: ServicesDep,
    session: WriteSessionDep,
    who: OperatorDep,
    if_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Approve a pending ramp or flip (operator, not its requester: 403 ``self_approval``);
    it applies now. ``If-Match`` (optional): the item's version. A cohort that moved since
    the request is a 409: reject the request and ask again."""
    return _decide("approve", subject, item_id, body, services, session, who, if_match)


@router.post("/approvals/{subject}/{item_id}/reject", responses=DECIDE_RESPONSES)
def reject(
    subject: SubjectPath,
    item_id: IdPath,
    body: ReasonIn,
    services: ServicesDep,
    session: WriteSessionDep,
    who: OperatorDep,
    if_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Reject a pending ramp or flip (operator; its requester may withdraw it so)."""
    return _decide("reject", subject, item_id, body, services, session, who, if_match)
