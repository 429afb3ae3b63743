"""The fleet's pages: Decisions (filters, a time window, a count, pages in a stable order, the
CSV export's link) and one page per deployment (its model, inputs, the command line that
decides them again, how ``turnout launch`` started vLLM and what vLLM said, its decision
history and the link to Explain them)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from turnout.dashboard.deployments import decide_line, explain_url, spec_rows
from turnout.dashboard.deps import MAX_BODY, ServicesDep
from turnout.dashboard.engine_fleet import current_views
from turnout.dashboard.filters import REASON_CODES, FiltersDep
from turnout.dashboard.impact import spec_config, spec_with_id
from turnout.dashboard.invocation import turnout_here
from turnout.dashboard.pages import UserDep, render
from turnout.dashboard.store import history
from turnout.dashboard.store.history import MAX_PAGE_SIZE, Cursor, EventFilter, EventPage
from turnout.dashboard.store.launches import LaunchRecord
from turnout.dashboard.store.models import utcnow
from turnout.dashboard.window import TimeWindow, WindowDep

router = APIRouter(include_in_schema=False, max_body_size=MAX_BODY)
PAGE_SIZES = (25, 50, 100, 200)
CursorQuery = Annotated[str, Query(max_length=200)]
SizeQuery = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)]


def _page(services: Any, where: EventFilter, size: int, after: str, before: str) -> EventPage:
    """The page the cursors ask for; ValueError for a cursor the page did not write."""
    with services.db.read_session() as session:
        return history.page_events(
            session=session,
            where=where,
            size=size,
            after=Cursor.decode(after) if after else None,
            before=Cursor.decode(before) if before else None,
        )


def _empty() -> EventPage:
    return EventPage([], 0, 0, None, None)


@router.get("/decisions", response_class=HTMLResponse)
def decisions_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    filters: FiltersDep,
    window: WindowDep,
    size: SizeQuery = 50,
    after: CursorQuery = "",
    before: CursorQuery = "",
) -> HTMLResponse:
    error = window.error
    page = _empty()
    if not error:
        try:
            page = _page(services, filters.where(window), size, after, before)
        except ValueError as err:
            error = str(err)
    query = {**filters.query(), **window.query(), **({"size": str(size)} if size != 50 else {})}
    return render(
        request,
        "decisions.html",
        user,
        status=422 if error else 200,
        page=page,
        filters=filters,
        window=window,
        size=size,
        error=error,
        query=query,
        export_query={**filters.query(), **window.query()},
        page_sizes=sorted({*PAGE_SIZES, size}),
        families=services.policy.family_names(),
        reason_codes=REASON_CODES,
    )


@router.get("/deployments/{deployment_id:path}", response_class=HTMLResponse)
def deployment_page(
    request: Request,
    deployment_id: str,
    services: ServicesDep,
    user: UserDep,
    size: SizeQuery = 25,
    after: CursorQuery = "",
    before: CursorQuery = "",
) -> HTMLResponse:
    with services.db.read_session() as session:
        row = history.get_deployment(session=session, deployment_id=deployment_id)
        latest = None if row is None else history.get_event(session=session, event_id=row.event_id)
    if row is None:
        return render(
            request,
            "deployment.html",
            user,
            status=404,
            deployment_id=deployment_id,
            deployment=None,
            error=f"no decision of a deployment {deployment_id!r} is recorded",
        )
    error = ""
    try:
        page = _page(services, EventFilter(deployment_id=deployment_id), size, after, before)
    except ValueError as err:
        page, error = _empty(), str(err)
    return render(
        request,
        "deployment.html",
        user,
        status=422 if error else 200,
        deployment_id=deployment_id,
        deployment=row,
        page=page,
        error=error,
        query={"size": str(size)} if size != 25 else {},
        window=TimeWindow(),
        launch=LaunchRecord.of(latest),
        engines=current_views(services, deployment_id=deployment_id),
        now=utcnow(),
        **_inputs(services, row),
    )


def _inputs(services: Any, row: Any) -> dict[str, Any]:
    """The deployment's inputs as the page shows them, and what they decide now."""
    spec = row.config
    if spec is None:
        return {"spec": None}
    line = decide_line(spec, deployment_id=row.deployment_id, pack=row.pack, turnout=turnout_here())
    config = spec_config(json.dumps(spec_with_id(spec, row.deployment_id), sort_keys=True))
    now = services.policy.decide(config) if config is not None else None
    return {
        "spec": spec,
        "spec_rows": spec_rows(spec),
        "decide_line": line,
        "explain_url": explain_url(spec),
        "decision_now": now,
        "same_pack": row.pack == services.policy.pack_name,
    }
