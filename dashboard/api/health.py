"""Runtime health from engines: batched ingest (``POST /health``, each report checked alone) and
V1 against V2 in one rollout stage (``GET /health``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.api.schemas import ErrorResponse, HealthOut
from turnout.dashboard.bodies import JsonRoute, body_validation_error, parse_body
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    MAX_BODY,
    MAX_INGEST_BODY,
    EngineDep,
    ReadSessionDep,
    ServicesDep,
    ViewerDep,
    http_error,
    known_query,
)
from turnout.dashboard.health_ingest import HealthEnvelope, check_batch
from turnout.dashboard.health_view import DEFAULT_RANGE, BadHealthQuery, build, check_filter
from turnout.dashboard.services import Services
from turnout.dashboard.store import health
from turnout.dashboard.window import MAX_TIME_TEXT, parse_time
from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import HealthAck, HealthReportIn, batch_digest

router = APIRouter(
    tags=["engine health"],
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)

_ENVELOPE = TypeAdapter(HealthEnvelope)
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/HealthIngestIn"}}
        },
    }
}


@router.post(
    "/health",
    response_model=HealthAck,
    openapi_extra=_BODY,
    responses={422: {"model": ErrorResponse}},
    max_body_size=MAX_INGEST_BODY,
)
async def post_health(request: Request, services: ServicesDep, _who: EngineDep) -> HealthAck:
    """Batched health reports from engines (``oracle.wire.HealthIngestIn``), idempotent by
    ``report_id``. Each report is checked alone: a bad one is listed in ``rejected`` (its
    position, id and ``{"code", "message"}``) and the others are stored. The answer comes
    after the commit and names the batch (``batch_digest`` of the report ids sent)."""
    value = parse_body(request, await request.body())
    try:
        envelope = _ENVELOPE.validate_python(value)
    except ValidationError as err:
        raise body_validation_error(err) from err
    checked = check_batch(
        envelope.reports, services.policy, max_skew_s=services.settings.max_clock_skew_s
    )
    inserted = await run_in_threadpool(_store, services, checked.reports)
    services.metrics.health_reports.labels("stored").inc(len(checked.reports))
    services.metrics.health_reports.labels("rejected").inc(len(checked.rejected))
    return HealthAck(
        accepted=len(checked.reports),
        inserted=inserted,
        rejected=checked.rejected,
        batch_digest=batch_digest(checked.ids),
    )


def _store(services: Services, reports: list[HealthReportIn]) -> int:
    if not reports:
        return 0
    with services.db.write_session() as session:
        inserted = health.ingest_reports(session=session, reports=reports)
        session.commit()
    return inserted


TimeQuery = Annotated[str | None, Query(max_length=MAX_TIME_TEXT)]


def _default_since(until: dt.datetime) -> dt.datetime:
    try:
        return until - DEFAULT_RANGE
    except OverflowError:
        raise BadHealthQuery(
            "since",
            f"since: 24 hours before until ({until.isoformat()}) is before year 1: give since",
        ) from None


@router.get("/health", response_model=HealthOut, responses={422: {"model": ErrorResponse}})
def get_health(
    services: ServicesDep,
    session: ReadSessionDep,
    _who: ViewerDep,
    stage: Annotated[str, Query(max_length=64)],
    since: TimeQuery = None,
    until: TimeQuery = None,
    family: Annotated[str | None, Query(max_length=64)] = None,
) -> HealthOut:
    """V1 and V2 of one rollout ``stage`` (a cohort id; the same cohort, so that the runners
    serve alike deployments), over the reports whose window ended in ``[since, until)``
    (``since`` default 24 hours ago, ``until`` now; ``2026-11-29``, ``2026-11-29T10:00`` in
    UTC, or ISO 8601 with an offset), of one ``family`` when given: the whole range per runner
    and the same per time bucket (sized for at most 120 buckets). An unknown stage or family
    is a 422 naming the closest."""
    now = dt.datetime.now(dt.UTC)
    try:
        end = parse_time(until, "until") if until else now
        start = parse_time(since, "since") if since else _default_since(end)
        check_filter(services, stage, family)
        return build(session, stage=stage, since=start, until=end, family=family)
    except BadHealthQuery as err:
        code = {"stage": ErrorCode.UNKNOWN_COHORT, "family": ErrorCode.UNKNOWN_FAMILY}.get(
            err.field, ErrorCode.INVALID_REQUEST
        )
        raise http_error(422, code, str(err)) from err
    except (ValueError, OverflowError) as err:  # a time that does not parse, or year 1
        raise http_error(422, ErrorCode.INVALID_REQUEST, str(err)) from err
