"""The Engine health page: V1 against V2 in one rollout stage, over a window, from the reports
engines send (``dashboard/health_view.py`` builds what it shows, as ``GET /api/v1/health``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from turnout.dashboard.deps import MAX_BODY, ServicesDep
from turnout.dashboard.health_view import page_context
from turnout.dashboard.pages import UserDep, render

router = APIRouter(include_in_schema=False, max_body_size=MAX_BODY)


@router.get("/health", response_class=HTMLResponse)
def health_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    stage: Annotated[str, Query(max_length=64)] = "",
    window: Annotated[str, Query(pattern="^(1h|24h|7d)$")] = "24h",
    family: Annotated[str, Query(max_length=64)] = "",
) -> HTMLResponse:
    """One stage's engines by runner (default: the stage that reported last), in the last
    hour, day or week, of one family when asked."""
    with services.db.read_session() as session:
        status, context = page_context(services, session, stage=stage, window=window, family=family)
    return render(request, "health.html", user, status=status, **context)
