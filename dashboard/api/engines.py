"""Serving engines: registration and heartbeat (``PUT /engines/{engine_id}``), a clean exit
(``DELETE``), the list with the runner a restart would give each (``GET /engines``), and the
targets of Prometheus' HTTP service discovery (``GET /prometheus/targets``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.api.schemas import ErrorResponse
from turnout.dashboard.bodies import JsonRoute
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    MAX_BODY,
    EngineDep,
    ServicesDep,
    ViewerDep,
    http_error,
    known_query,
)
from turnout.dashboard.engine_fleet import current_views, live_engines, prometheus_targets
from turnout.dashboard.services import Services
from turnout.dashboard.store import engines as engine_store
from turnout.dashboard.store.models import utcnow
from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import ENGINE_ID_PATTERN, UNKNOWN_FAMILY, EngineIn

router = APIRouter(
    tags=["engines"],
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)

EngineIdPath = Annotated[str, Path(pattern=ENGINE_ID_PATTERN)]


def _check(services: Services, engine: EngineIn, engine_id: str) -> None:
    """422 for a registration this service cannot place: another id than the path's, another
    pack, a family or stage the pack does not have, or a family outside the stage it names
    (a stage matched by attributes alone takes any family)."""
    policy = services.policy
    problem = None
    if engine.engine_id != engine_id:
        problem = f"engine_id {engine.engine_id!r} is not the path's {engine_id!r}"
    elif engine.pack not in (policy.pack.name, policy.pack_name):
        problem = (
            f"{engine.pack!r} is not the pack this service runs ({policy.pack.name!r}): "
            "register with the service of that pack"
        )
    elif engine.family not in policy.pack.families and engine.family != UNKNOWN_FAMILY:
        problem = f"unknown family {engine.family!r} in pack {policy.pack.name}"
    elif engine.stage is not None and engine.stage not in policy.cohort_families():
        problem = (
            f"unknown stage {engine.stage!r}; the stages of pack {policy.pack.name}: "
            + ", ".join(policy.cohort_families())
        )
    elif (
        engine.stage is not None
        and engine.family != UNKNOWN_FAMILY
        and (named := policy.cohort_families()[engine.stage])
        and engine.family not in named
    ):
        # Its series would be read by the gates of a stage it is not in.
        problem = (
            f"family {engine.family!r} is not in stage {engine.stage!r} "
            f"({', '.join(named)}): register the stage its decision named"
        )
    size = len(json.dumps(engine.config)) if engine.config is not None else 0
    if problem is None and size > services.settings.max_config_bytes:
        problem = (
            f"config is {size} bytes of JSON, over the {services.settings.max_config_bytes} "
            "a decision event may carry (TURNOUT_MAX_CONFIG_BYTES)"
        )
    if problem is not None:
        raise http_error(422, ErrorCode.INVALID_REQUEST, problem)


def _register(services: Services, engine: EngineIn) -> bool:
    with services.db.write_session() as session:
        fresh = engine_store.register(session=session, engine=engine, now=utcnow())
        session.commit()
    return fresh


@router.put(
    "/engines/{engine_id}",
    status_code=200,
    responses={201: {"description": "registered"}, 422: {"model": ErrorResponse}},
)
async def put_engine(
    engine_id: EngineIdPath,
    body: EngineIn,
    response: Response,
    services: ServicesDep,
    _who: EngineDep,
) -> dict[str, Any]:
    """An engine's registration, and its heartbeat (the same body again, every 15 s by
    default): 201 the first time (or after a clean exit), then 200."""
    _check(services, body, engine_id)
    fresh = await run_in_threadpool(_register, services, body)
    response.status_code = 201 if fresh else 200
    return {"engine_id": engine_id, "registered": fresh, "ttl_s": services.settings.engine_ttl_s}


def _end(services: Services, engine_id: str) -> bool:
    with services.db.write_session() as session:
        ended = engine_store.end(session=session, engine_id=engine_id, now=utcnow())
        session.commit()
    return ended


@router.delete("/engines/{engine_id}", status_code=204, responses={404: {"model": ErrorResponse}})
async def delete_engine(
    engine_id: EngineIdPath, services: ServicesDep, _who: EngineDep
) -> Response:
    """An engine's clean exit: it leaves the targets and the lists at once."""
    if not await run_in_threadpool(_end, services, engine_id):
        raise http_error(404, ErrorCode.NOT_FOUND, f"no live engine {engine_id!r}")
    return Response(status_code=204)


@router.get("/engines")
async def get_engines(
    services: ServicesDep,
    _who: ViewerDep,
    stage: Annotated[str | None, Query(max_length=64)] = None,
    stale: Annotated[bool | None, Query(description="only engines on an old decision")] = None,
) -> dict[str, Any]:
    """The live engines, each with ``expected_runner`` (what a restart would run under the
    current canary snapshot) and ``stale`` (it runs another one). An unknown ``stage`` is a
    422 that lists the stages."""
    stages = services.policy.cohort_families()
    if stage is not None and stage not in stages:
        raise http_error(
            422,
            ErrorCode.INVALID_REQUEST,
            f"unknown stage {stage!r}; the stages of pack {services.policy.pack.name}: "
            + ", ".join(stages),
        )
    views = await run_in_threadpool(lambda: current_views(services, stage=stage))
    if stale is not None:
        views = [v for v in views if v.stale == stale]
    now = utcnow()
    return {
        "engines": [v.to_json(now) for v in views],
        "num_engines": len(views),
        "num_stale": sum(v.stale for v in views),
        "ttl_s": services.settings.engine_ttl_s,
    }


@router.get("/prometheus/targets")
async def get_prometheus_targets(services: ServicesDep, _who: ViewerDep) -> list[dict[str, Any]]:
    """Prometheus' HTTP service discovery (``http_sd_configs``): one target group per live
    engine, with the labels ``turnout_deployment``, ``turnout_stage``, ``turnout_family``,
    ``turnout_runner``, ``turnout_cohort``, ``turnout_decision_digest``, ``vllm_version``
    (docs/fleet.md)."""
    rows = await run_in_threadpool(live_engines, services)
    return prometheus_targets(rows)
