"""The upgrade preview: recorded deployments decided by two packs (dashboard.upgrade)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.api.schemas import ErrorResponse, UpgradePreviewOut
from turnout.dashboard.bodies import JsonRoute
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    ServicesDep,
    ViewerDep,
    heavy_read_slot,
    http_error,
    known_query,
)
from turnout.dashboard.services import Services
from turnout.dashboard.upgrade import preview_json, upgrade_preview
from turnout.oracle import OracleError

router = APIRouter(
    tags=["upgrade"],
    responses=ERROR_RESPONSES,
    route_class=JsonRoute,
    dependencies=[Depends(known_query)],
)


@router.get(
    "/upgrade-preview", response_model=UpgradePreviewOut, responses={422: {"model": ErrorResponse}}
)
async def get_upgrade_preview(
    services: ServicesDep,
    principal: ViewerDep,
    from_pack: Annotated[
        str | None,
        Query(
            alias="from",
            min_length=1,
            max_length=64,
            description="the pack the fleet runs now (default: the release before `to`)",
        ),
    ] = None,
    to_pack: Annotated[
        str | None,
        Query(
            alias="to",
            min_length=1,
            max_length=64,
            description="the pack to preview (default: the newest vLLM release)",
        ),
    ] = None,
    include_demo: bool = True,
) -> UpgradePreviewOut:
    """Every recorded deployment with its reported config decided by both packs: per family,
    how many would change runner (v1→v2, v2→refuse, …) and why on each side. An unknown pack
    is a 422 ``unknown_pack`` naming the closest one. A heavy read: over
    ``TURNOUT_MAX_HEAVY_READS`` (or the token's share) it is a 429."""
    who = heavy_read_slot(services, principal)
    try:
        body = await run_in_threadpool(_preview, services, from_pack, to_pack, include_demo)
    finally:
        services.heavy_reads.release(who)
    return UpgradePreviewOut.model_validate(body)


def _preview(
    services: Services, from_pack: str | None, to_pack: str | None, include_demo: bool
) -> dict[str, object]:
    try:
        return preview_json(
            upgrade_preview(services, from_pack, to_pack, include_demo=include_demo)
        )
    except OracleError as err:
        raise http_error(422, err.code, err.message) from err
