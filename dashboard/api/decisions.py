"""Decide and explain (the oracle, with the store's canaries), decision-event ingest and the
fleet's decisions and fallback aggregates."""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool

from turnout.dashboard import fallbacks as fallback_view
from turnout.dashboard.api.schemas import (
    DeploymentIn,
    ErrorResponse,
    EventIn,
    EventOut,
    FallbacksOut,
    FallbacksOverTime,
    FamilyFallbacks,
    IngestIn,
    IngestOut,
    MatrixOut,
    OtherReasons,
    RankedReason,
    Window,
)
from turnout.dashboard.bodies import (
    JsonBodyError,
    JsonRoute,
    body_validation_error,
    check_media_type,
    json_error,
    parse_body,
    read_json,
)
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    MAX_BODY,
    MAX_INGEST_BODY,
    EngineDep,
    ReadSessionDep,
    ServicesDep,
    ViewerDep,
    authorize,
    bounded_body,
    current_snapshot,
    http_error,
    known_query,
)
from turnout.dashboard.event_checks import event_errors
from turnout.dashboard.policy import config_from_request
from turnout.dashboard.services import Services
from turnout.dashboard.store import aggregates, events, launches
from turnout.dashboard.store.latest_counts import reason_kind
from turnout.dashboard.store.tokens import Role
from turnout.oracle import DeploymentConfig, OracleError
from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import batch_digest

router = APIRouter(
    tags=["decisions"],
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)


_DEPLOYMENT_BODY = TypeAdapter(DeploymentIn)
# GET /fallbacks lists this many reasons unless asked (?limit=), and at most the second; the
# rest are summed in one "other" entry: the answer stays small whatever reasons are stored.
DEFAULT_FALLBACK_REASONS = 100
MAX_FALLBACK_REASONS = 1000


def _body_ref(name: str) -> dict[str, object]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


_CACHED_BODY = 4096  # larger bodies are parsed every time, never kept as cache keys


_BODY_CONFIGS: dict[tuple[str | None, bool, bytes], DeploymentConfig] = {}
_MAX_BODY_CONFIGS = 4096


async def _config_from_bytes(
    raw: bytes, release: str | None, offline: bool = True
) -> DeploymentConfig:
    """Validating the body and building the config costs more than deciding: fleets send the
    same few bodies again and again, so the parsed config (a frozen value) is kept per body
    (small bodies only: 4,096 cached megabyte bodies would be gigabytes). Errors are raised,
    hence never cached. A body not seen before is parsed in the thread pool: a model id may
    be looked up on the hub (oracle/sources/hub.py), which must not stall the event loop.
    ``release``: the vLLM release whose `vllm serve` parser reads a command (the pack's)."""
    key = (release, offline, raw)
    hit = _BODY_CONFIGS.get(key) if len(raw) <= _CACHED_BODY else None
    if hit is not None:
        return hit
    config = await run_in_threadpool(_parse_config, raw, release, offline)
    if len(raw) <= _CACHED_BODY:
        if len(_BODY_CONFIGS) >= _MAX_BODY_CONFIGS:
            _BODY_CONFIGS.clear()
        _BODY_CONFIGS[key] = config
    return config


def _parse_config(raw: bytes, release: str | None, offline: bool) -> DeploymentConfig:
    try:
        body = _DEPLOYMENT_BODY.validate_python(read_json(raw))
    except JsonBodyError as err:
        raise json_error(err) from None
    except ValidationError as err:
        raise body_validation_error(err) from err
    try:
        return config_from_request(
            config=body.config,
            command=body.command,
            argv=body.argv,
            env=body.env,
            release=release,
            offline=offline,
        )
    except OracleError as err:
        raise http_error(422, err.code, str(err)) from err
    except ValueError as err:
        raise http_error(422, ErrorCode.BAD_COMMAND, str(err)) from err


@router.post(
    "/decide",
    openapi_extra=_body_ref("DeploymentIn"),
    responses={
        200: {"description": "the Decision (docs/oracle-api.md, JSON)"},
        422: {"model": ErrorResponse},
    },
)
async def post_decide(request: Request) -> Response:
    """The runner decision for one deployment under the service's current canaries (viewer)."""
    # The hot path: no FastAPI dependencies (solving them cost more than deciding).
    await authorize(request, Role.viewer)
    services: Services = request.app.state.services
    raw = await bounded_body(request)
    check_media_type(request, raw)
    config = await _config_from_bytes(
        raw, services.policy.release, not services.settings.hub_online
    )
    snap = await current_snapshot(services)
    body, runner, reason_code = services.policy.decision_json(config, snap)
    services.metrics.decisions.labels("api", runner, reason_code).inc()
    return Response(body, media_type="application/json")


@router.post(
    "/explain",
    openapi_extra=_body_ref("DeploymentIn"),
    responses={200: {"description": "the Explanation"}, 422: {"model": ErrorResponse}},
)
async def post_explain(request: Request, services: ServicesDep, _who: ViewerDep) -> Response:
    """The decision plus the smallest config changes that would reach V2 (each re-checked)."""
    raw = await request.body()
    check_media_type(request, raw)
    config = await _config_from_bytes(
        raw, services.policy.release, not services.settings.hub_online
    )
    snap = await current_snapshot(services)
    explanation = await run_in_threadpool(services.policy.explain, config, snap.canaries)
    return Response(json.dumps(explanation.to_json()), media_type="application/json")


@router.get("/matrix", response_model=MatrixOut)
async def get_matrix(services: ServicesDep, _who: ViewerDep) -> MatrixOut:
    """Every cell of the pack's closed domains decided under the current canaries, summarised
    as family x dimension value → cells per runner (cached per canary snapshot)."""
    summary = await run_in_threadpool(services.policy.matrix)
    return MatrixOut(
        num_cells=summary.num_cells,
        pins=summary.pins,
        scenarios=summary.scenarios,
        grid=summary.grid,
    )


_INGEST_BODY = TypeAdapter(IngestIn)


@router.post(
    "/decisions",
    response_model=IngestOut,
    responses={422: {"model": ErrorResponse}},
    openapi_extra=_body_ref("IngestIn"),
    max_body_size=MAX_INGEST_BODY,
)
async def post_decisions(request: Request, services: ServicesDep, _who: EngineDep) -> IngestOut:
    """Batched ingest from engines, idempotent by ``event_id``; a bad event rejects the batch
    whole (422 naming the event, the field and the value; nothing stored): one of another
    pack, a family or stage its pack does not have, a config over the size bound, a time more
    than the allowed clock skew ahead. The answer comes after the commit: an acknowledged
    event is durable."""
    body = _ingest_body(request, await request.body())
    problems = event_errors(body.events, services.policy, services.settings)
    if problems:
        raise RequestValidationError(problems)
    records = body.events  # EventIn has what ingest reads (EventLike)
    stored = await run_in_threadpool(_ingest, services, records)
    # A follow-up (vLLM's start-up line) is no decision: it is counted by what it says.
    counts = Counter(
        (e.runner or "none", e.reason_code) for e in body.events if launches.follows(e) is None
    )
    for (runner, code), n in counts.items():
        services.metrics.decisions.labels("ingest", runner, code).inc(n)
    for a in stored.attached:
        services.metrics.startup_lines.labels("agrees" if a.agrees else "differs").inc()
    return IngestOut(
        accepted=len(records),
        inserted=stored.inserted,
        batch_digest=batch_digest([e.event_id for e in records]),
    )


def _ingest_body(request: Request, raw: bytes) -> IngestIn:
    """The batch, validated straight from its bytes (one pass in pydantic-core: at 500 events
    a batch this halves the cost of decoding, then validating). That pass takes NaN and
    Infinity in a ``config``: a body that may hold them is read by the strict parser first."""
    check_media_type(request, raw)
    try:
        if b"NaN" in raw or b"Infinity" in raw:  # rare: in a string, or not JSON at all
            return _INGEST_BODY.validate_python(parse_body(request, raw))
        return _INGEST_BODY.validate_json(raw)
    except ValidationError as err:
        if any(e["type"] == "json_invalid" for e in err.errors()):
            parse_body(request, raw)  # raises the strict parser's 422, which says why
        raise body_validation_error(err) from err


def _ingest(services: Services, records: list[EventIn]) -> events.Ingested:
    with services.write_gate.ingest(), services.db.write_session() as session:
        stored = events.ingest_batch(session=session, events=records)
        session.commit()
    return stored


@router.get("/decisions", response_model=list[EventOut])
def get_decisions(
    session: ReadSessionDep,
    _who: ViewerDep,
    family: Annotated[str | None, Query(max_length=64)] = None,
    runner: Annotated[str | None, Query(pattern="^(v1|v2|none)$")] = None,
    reason_code: Annotated[str | None, Query(max_length=32)] = None,
    rule_id: Annotated[str | None, Query(max_length=128)] = None,
    deployment_id: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[EventOut]:
    """Recorded decisions, newest first, filtered."""
    rows = events.list_events(
        session=session,
        limit=limit,
        family=family,
        runner=runner,
        reason_code=reason_code,
        rule_id=rule_id,
        deployment_id=deployment_id,
    )
    return [EventOut.of(r) for r in rows]


@router.get("/fallbacks", response_model=FallbacksOut, responses={422: {"model": ErrorResponse}})
def get_fallbacks(
    services: ServicesDep,
    session: ReadSessionDep,
    _who: ViewerDep,
    window: Window = "all",
    family: Annotated[str | None, Query(max_length=64)] = None,
    stage: Annotated[str | None, Query(max_length=64)] = None,
    pack: Annotated[str | None, Query(max_length=64)] = None,
    include_demo: bool = True,
    limit: Annotated[int, Query(ge=1, le=MAX_FALLBACK_REASONS)] = DEFAULT_FALLBACK_REASONS,
) -> FallbacksOut:
    """Deployments whose latest decision falls in ``window`` (1h, 24h, 7d or all), of a
    ``family`` and rollout ``stage`` (cohort id) of the pack when given: those not on V2 by
    kind, by reason ranked by affected deployments, by family, and over time (the same
    deployments by when they decided). The first ``limit`` reasons are listed, the rest summed
    in ``other``, so the answer's size is bounded whatever is stored. Read from aggregates kept
    at ingest. An unknown family or stage is a 422 naming the closest."""
    try:
        fallback_view.check_filter(services, family, stage)
    except fallback_view.BadFilter as err:
        code = ErrorCode.UNKNOWN_FAMILY if err.field == "family" else ErrorCode.UNKNOWN_COHORT
        raise http_error(422, code, str(err)) from err
    fleet = aggregates.FleetFilter(family=family, stage=stage, pack=pack, include_demo=include_demo)
    view = fallback_view.build(services, session, window=window, fleet=fleet)
    r, labels, enabled = view.report, view.labels, view.enabled
    shown, rest = r.ranked[:limit], r.ranked[limit:]
    kept = {k for k, _n in shown}
    other = None
    if rest:
        other = OtherReasons(
            num_reasons=len(rest),
            deployments=sum(n for _k, n in rest),
            by_family={
                f: sum(n for k, n in c.items() if k not in kept) for f, c in r.by_family.items()
            },
            over_time=[
                sum(col)
                for col in zip(
                    *(v for k, v in r.over_time.items() if k not in kept),
                    strict=True,
                )
            ]
            or [0] * len(r.bins),
        )
    return FallbacksOut(
        window=window,
        since=r.since,
        family=family,
        stage=stage,
        pack=pack,
        num_deployments=r.num_deployments,
        num_fallbacks=r.num_fallbacks,
        by_kind={k: r.by_kind.get(k, 0) for k in aggregates.KINDS},
        num_reasons=len(r.ranked),
        ranked=[
            RankedReason(
                key=k,
                label=labels.get(k, k),
                kind=reason_kind(k),
                deployments=n,
                stage_enabled_since=enabled[k].since if k in enabled else None,
            )
            for k, n in shown
        ],
        other=other,
        by_family={f: {k: n for k, n in c.items() if k in kept} for f, c in r.by_family.items()},
        families={
            f: FamilyFallbacks(
                deployments=c.deployments,
                fallbacks=c.fallbacks,
                by_kind={k: c.by_kind.get(k, 0) for k in aggregates.KINDS},
            )
            for f, c in r.families.items()
        },
        over_time=FallbacksOverTime(
            bin_s=r.bin_s,
            bins=r.bins,
            by_reason={k: v for k, v in r.over_time.items() if k in kept},
        ),
    )
