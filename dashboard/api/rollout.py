"""Canaries (read; flip with If-Match and a reason), kill switch, audit log, impact preview."""

from __future__ import annotations

from typing import Annotated, NoReturn

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.api.schemas import (
    AuditOut,
    CanariesOut,
    CanaryFlipOut,
    CanaryPatch,
    CohortOut,
    ErrorResponse,
    ImpactOut,
    KillSwitchIn,
    KillSwitchOut,
    KillSwitchSetOut,
)
from turnout.dashboard.api.schemas_rollout import KillSwitchReachOut, ScheduledFlipOut, StageOut
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
    authorize,
    check_query,
    current_snapshot,
    http_error,
    known_query,
    raise_store_error,
)
from turnout.dashboard.impact import impact_of_flip
from turnout.dashboard.services import Services
from turnout.dashboard.store import audit, ramps, schedule
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store.errors import NotFound, StoreError
from turnout.dashboard.store.models import Canary
from turnout.dashboard.store.models_rollout import ScheduledFlip
from turnout.dashboard.store.tokens import Role
from turnout.oracle.errors import ErrorCode

router = APIRouter(
    tags=["rollout"],
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)


def _cohort_out(services: Services, canary: Canary) -> CohortOut:
    labels = services.policy.cohort_labels()
    return CohortOut(
        cohort=canary.cohort,
        label=labels.get(canary.cohort, canary.cohort),
        position=services.policy.rollout_position(canary.cohort),
        enabled=canary.enabled,
        percentage=canary.percentage,
        version=canary.version,
        updated_at=canary.updated_at,
        updated_by=canary.updated_by,
    )


def read_canaries(services: Services, session: Session) -> tuple[CanariesOut, str]:
    state = canary_store.read_state(session=session)
    ks = canary_store.get_kill_switch(session=session)
    rows = sorted(
        (_cohort_out(services, c) for c in canary_store.list_canaries(session=session)),
        key=lambda c: (c.position, c.cohort),
    )
    body = CanariesOut(
        pack=services.policy.pack_name,
        pack_digest=services.policy.pack.digest,
        kill_switch=KillSwitchOut(
            engaged=ks.engaged,
            version=ks.version,
            updated_at=ks.updated_at,
            updated_by=ks.updated_by,
        ),
        cohorts=rows,
    )
    return body, state.etag


async def get_canaries_fast(request: Request) -> Response:
    """``GET /canaries`` as engines fetch it at start-up (a 0.5 s deadline), without FastAPI's
    dependency solving or a database read while the process's snapshot is fresh: the ETag
    comes from the cached snapshot (``snapshot_ttl_s``, dropped by this process's own flips),
    a matching If-None-Match is a 304 at once, and the body is the one serialised for that
    ETag (each change bumps a version the ETag names, so the body is a function of it). Under
    an export storm its p99 went from 148 to 27 ms (docs/benchmarks.md). The APIRoute below
    documents it in the OpenAPI; a plain route ahead of it answers."""
    await authorize(request, Role.viewer)
    check_query(request, frozenset())
    services: Services = request.app.state.services
    snap = await current_snapshot(services)
    etag = snap.state.etag
    if _none_match(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers={"ETag": etag})
    cached: tuple[str, bytes] | None = getattr(request.app.state, "canaries_body", None)
    if cached is None or cached[0] != etag:
        cached = await run_in_threadpool(_serialised_canaries, services)
        request.app.state.canaries_body = cached
    return Response(cached[1], media_type="application/json", headers={"ETag": cached[0]})


def _none_match(header: str | None, etag: str) -> bool:
    """``If-None-Match`` names ``etag``: ``*``, or any listed tag by the weak comparison
    (``W/"7"`` matches ``"7"``) that RFC 9110 §13.1.2 prescribes for this header."""
    if header is None:
        return False
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return "*" in tags or etag.removeprefix("W/") in tags


def _serialised_canaries(services: Services) -> tuple[str, bytes]:
    with services.db.read_session() as session:
        body, etag = read_canaries(services, session)
    return etag, body.model_dump_json().encode()


@router.get(
    "/canaries",
    response_model=CanariesOut,
    responses={304: {"description": "If-None-Match matched the current ETag"}},
)
def get_canaries(
    services: ServicesDep,
    session: ReadSessionDep,
    _who: ViewerDep,
    response: Response,
    if_none_match: Annotated[str | None, Header()] = None,
) -> CanariesOut | Response:
    """The canary snapshot (every cohort and the kill switch), with a strong ETag."""
    body, etag = read_canaries(services, session)
    if _none_match(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return body


@router.get(
    "/canaries/{cohort}", response_model=CohortOut, responses={404: {"model": ErrorResponse}}
)
def get_canary(
    cohort: str, services: ServicesDep, session: ReadSessionDep, _who: ViewerDep, response: Response
) -> CohortOut:
    """One cohort; its ETag is the version to send back in If-Match."""
    try:
        canary = canary_store.get_canary(session=session, cohort=cohort)
    except StoreError as err:
        raise_cohort_error(services, cohort, err)
    response.headers["ETag"] = f'"{canary.version}"'
    return _cohort_out(services, canary)


@router.get("/stages", response_model=list[StageOut])
def get_stages(services: ServicesDep, _who: ViewerDep) -> list[StageOut]:
    """The pack's rollout stages in order, each with the families it names (the command
    line reads a family name as its first stage: ``llama`` → ``llama-mistral-dense``)."""
    labels = services.policy.cohort_labels()
    return [
        StageOut(cohort=cohort, label=labels.get(cohort, cohort), position=i, families=list(names))
        for i, (cohort, names) in enumerate(services.policy.cohort_families().items())
    ]


def raise_cohort_error(services: Services, cohort: str, err: StoreError) -> NoReturn:
    """Map a store error about ``cohort`` to HTTP; an unknown cohort's 404 says which cohorts
    exist (or, for a family name, which cohort holds it)."""
    if isinstance(err, NotFound) and err.code == ErrorCode.UNKNOWN_COHORT:
        raise http_error(404, err.code, services.policy.store_error_text(cohort, err)) from err
    raise_store_error(err)


def parse_if_match(if_match: str | None, what: str = "the cohort's version (its ETag)") -> int:
    """The version of an ``If-Match`` header (``"3"``, ``3`` or ``W/"3"``); 428 without it,
    whose message says to send ``what`` (the version of the item the route changes)."""
    if if_match is None:
        raise http_error(428, ErrorCode.IF_MATCH_REQUIRED, f"send If-Match with {what}")
    value = if_match.strip().removeprefix("W/").strip('"')
    if not (value.isascii() and value.isdigit()):  # "²".isdigit() is true, int("²") fails
        raise http_error(400, ErrorCode.BAD_IF_MATCH, f"If-Match {if_match!r} is not a version")
    digits = value.lstrip("0") or "0"
    # Beyond any 64-bit version no cohort is there (a 409); int() refuses strings of more than
    # 4,300 digits, so such a value is not converted.
    return int(digits) if len(digits) <= len(str(MAX_ID)) else MAX_ID + 1


@router.patch(
    "/canaries/{cohort}",
    response_model=CanaryFlipOut,
    responses={
        404: {"model": ErrorResponse},
        409: {"model": ErrorResponse},
        428: {"model": ErrorResponse},
        202: {"model": ScheduledFlipOut, "description": "waiting for another operator's approval"},
    },
)
def patch_canary(
    cohort: str,
    body: CanaryPatch,
    services: ServicesDep,
    session: WriteSessionDep,
    who: OperatorDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> CanaryFlipOut | JSONResponse:
    """Flip a cohort's canary (operator). ``If-Match`` must carry the version read; a stale one
    gets 409 with the current version in ETag. Asking for the state the cohort already has is
    a 200 with ``changed: false``: same version, no audit entry. When the service requires
    approvals, a flip that sends more of the cohort to V2 waits for another operator: a 202
    with the pending flip (``GET /approvals``)."""
    version = parse_if_match(if_match)
    require_approval = services.require_approval()
    try:
        with services.write_gate.control():  # ahead of queued ingest (dashboard/write_gate.py)
            flip = schedule.flip_or_request(
                session=session,
                cohort=cohort,
                enabled=body.enabled,
                percentage=body.percentage,
                reason=body.reason,
                actor=who.actor,
                requester=who.name,
                if_version=version,
                require_approval=require_approval,
            )
            session.commit()
    except StoreError as err:
        raise_cohort_error(services, cohort, err)
    if isinstance(flip, ScheduledFlip):  # waits for another operator
        from turnout.dashboard.api.ramps import flip_out

        return JSONResponse(flip_out(flip).model_dump(mode="json"), status_code=202)
    if flip.changed:
        services.policy.invalidate()
        services.metrics.canary_flips.labels(cohort).inc()
    response.headers["ETag"] = f'"{flip.canary.version}"'
    return CanaryFlipOut(**_cohort_out(services, flip.canary).model_dump(), changed=flip.changed)


@router.get("/kill-switch", response_model=KillSwitchReachOut)
def get_kill_switch(session: ReadSessionDep, _who: ViewerDep) -> KillSwitchReachOut:
    """The kill switch, and how many deployments still run V2 under it: those whose latest
    decision, made before it was engaged, is V2 (until they restart), those pinned to V2
    since, and the engines whose latest health report since then says V2."""
    ks = canary_store.get_kill_switch(session=session)
    before, after = ramps.v2_reach(session=session, since=ks.updated_at) if ks.engaged else (0, 0)
    engines = ramps.v2_engines_reporting(session=session, since=ks.updated_at) if ks.engaged else 0
    return KillSwitchReachOut(
        engaged=ks.engaged,
        version=ks.version,
        updated_at=ks.updated_at,
        updated_by=ks.updated_by,
        v2_decided_before=before,
        v2_decided_after=after,
        v2_engines_reporting=engines,
    )


@router.post("/kill-switch", response_model=KillSwitchSetOut)
def post_kill_switch(
    body: KillSwitchIn, services: ServicesDep, session: WriteSessionDep, who: OperatorDep
) -> KillSwitchSetOut:
    """Engage or release the global kill switch (operator, with a reason): engaged sends
    every auto deployment to V1. No If-Match: an emergency stop must not need a read first.
    Asking for the state it already has is a 200 with ``changed: false``: same version, no
    audit entry."""
    try:
        with services.write_gate.control():  # ahead of queued ingest (dashboard/write_gate.py)
            result = canary_store.set_kill_switch(
                session=session, engaged=body.engaged, reason=body.reason, actor=who.actor
            )
            session.commit()
    except StoreError as err:
        raise_store_error(err)
    if result.changed:
        services.policy.invalidate()
    ks = result.kill_switch
    return KillSwitchSetOut(
        engaged=ks.engaged,
        version=ks.version,
        updated_at=ks.updated_at,
        updated_by=ks.updated_by,
        changed=result.changed,
    )


@router.get("/audit", response_model=list[AuditOut])
def get_audit(
    session: ReadSessionDep,
    _who: ViewerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    target: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
) -> list[AuditOut]:
    """The audit log, newest first (page with ``before_id``)."""
    rows = audit.list_entries(session=session, limit=limit, before_id=before_id, target=target)
    return [AuditOut.model_validate(r, from_attributes=True) for r in rows]


@router.get("/impact", response_model=ImpactOut, responses={404: {"model": ErrorResponse}})
async def get_impact(
    services: ServicesDep,
    _who: ViewerDep,
    cohort: Annotated[str, Query(min_length=1, max_length=64)],
    enabled: bool,
    percentage: Annotated[int | None, Query(ge=0, le=100)] = None,
) -> ImpactOut:
    """How many recorded deployments would change runner if this flip happened (each
    re-decided by the oracle with the hypothetical snapshot)."""
    return await run_in_threadpool(_impact, services, cohort, enabled, percentage)


def _impact(services: Services, cohort: str, enabled: bool, percentage: int | None) -> ImpactOut:
    try:
        return impact_of_flip(services, cohort, enabled, percentage)
    except StoreError as err:
        raise_cohort_error(services, cohort, err)
