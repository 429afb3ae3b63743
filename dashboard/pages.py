"""Server-rendered pages (Jinja2; htmx for the confirm forms, Chart.js for the charts).

The pages sign in with a token once and then use a server-side session (dashboard.auth): its
id in an HttpOnly, SameSite=Strict cookie, the forms' CSRF field bound to it. What a page
offers follows the role, as the API's routes do: a viewer sees no action buttons, the confirm
fragment of a flip needs an operator, and the form handlers check the role again.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from turnout.dashboard.auth import (
    COOKIE_NAME,
    Principal,
    csrf_ok,
    csrf_token,
    flash_ok,
    flash_signature,
)
from turnout.dashboard.canary_view import cohort_rows, describe_when, flip_preview
from turnout.dashboard.deployments import deployment_url
from turnout.dashboard.deps import MAX_BODY, MAX_ID, ServicesDep
from turnout.dashboard.engine_fleet import current_views
from turnout.dashboard.invocation import turnout_here
from turnout.dashboard.services import Services
from turnout.dashboard.store import aggregates, audit
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store.errors import StoreError
from turnout.dashboard.store.models import utcnow
from turnout.dashboard.store.tokens import Role
from turnout.oracle import bounded_json

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parent / "templates"))
TEMPLATES.env.filters["tojson_compact"] = lambda v: json.dumps(v, separators=(",", ":"))
TEMPLATES.env.filters["deployment_url"] = deployment_url
TEMPLATES.env.filters["urlencode_pairs"] = lambda query, **more: urlencode({**query, **more})
TEMPLATES.env.filters["describe_when"] = describe_when
TEMPLATES.env.filters["bake"] = lambda s: (
    f"{s // 3600} h" if s % 3600 == 0 and s else f"{s // 60} min" if s % 60 == 0 else f"{s} s"
)

router = APIRouter(include_in_schema=False, max_body_size=MAX_BODY)


class SignIn(Exception):
    """Raised by page dependencies when the visitor must sign in first."""


def page_user(request: Request, services: ServicesDep) -> Principal:
    session_id = request.cookies.get(COOKIE_NAME)
    principal = services.verifier.session_principal(session_id) if session_id else None
    if principal is None:
        raise SignIn()
    return principal


UserDep = Annotated[Principal, Depends(page_user)]


def render(
    request: Request, name: str, user: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    session_id = request.cookies.get(COOKIE_NAME) or ""
    response = TEMPLATES.TemplateResponse(
        request,
        name,
        {
            "user": user,
            "csrf": csrf_token(session_id) if user and session_id else "",
            "can_operate": bool(user and user.role.allows(Role.operator)),
            "can_admin": bool(user and user.role.allows(Role.admin)),
            "turnout": turnout_here(),
            **context,
        },
        status_code=status,
    )
    response.headers["Cache-Control"] = "no-store"  # a signed-in page is no one else's
    return response


def _day_axis(days: int) -> list[str]:
    """Every day of the window, oldest first (charts show empty days as zero)."""
    today = dt.datetime.now(dt.UTC).date()
    return [(today - dt.timedelta(days=n)).isoformat() for n in range(days - 1, -1, -1)]


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, services: ServicesDep, user: UserDep) -> HTMLResponse:
    with services.db.read_session() as session:
        ov = aggregates.overview(session=session)
        ks = canary_store.get_kill_switch(session=session)
        waiting = dict(aggregates.fallbacks(session=session).ranked)
    from turnout.dashboard.rollout_view import stage_ramps

    total = sum(ov.by_runner.values())
    return render(
        request,
        "overview.html",
        user,
        overview=ov,
        total=total,
        kill_switch=ks,
        waiting=waiting,
        ramps=stage_ramps(services),
        cohorts=cohort_rows(services),
        pack=services.policy.pack_name,
        chart={"by_runner": ov.by_runner, "by_day": ov.by_day, "days": _day_axis(30)},
    )


@router.get("/fallbacks", response_class=HTMLResponse)
def fallbacks(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    window: Annotated[str, Query(pattern="^(1h|24h|7d|all)$")] = "all",
    family: Annotated[str, Query(max_length=64)] = "",
    stage: Annotated[str, Query(max_length=64)] = "",
    families: Annotated[str, Query(pattern="^(|all)$")] = "",
    reasons: Annotated[str, Query(pattern="^(|all)$")] = "",
) -> HTMLResponse:
    """Fallback reasons by kind (blocked by a feature, waiting for its stage, held by an
    operator), in a time window, for a family and a stage (``dashboard/fallbacks.py``)."""
    from turnout.dashboard.fallbacks import page_context

    with services.db.read_session() as session:
        status, context = page_context(
            services,
            session,
            window=window,
            family=family,
            stage=stage,
            all_families=families == "all",
            all_reasons=reasons == "all",
        )
    return render(request, "fallbacks.html", user, status=status, **context)


@router.get("/canaries", response_class=HTMLResponse)
def canaries_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    message: str = "",
    error: str = "",
    sig: str = "",
) -> HTMLResponse:
    if not flash_ok(request.cookies.get(COOKIE_NAME, ""), message, error, sig):
        message = error = ""  # not from a form of this session: a link anyone could write
    from turnout.dashboard.rollout_view import rollout_view

    with services.db.read_session() as session:
        ks = canary_store.get_kill_switch(session=session)
    engines = current_views(services)
    return render(
        request,
        "canaries.html",
        user,
        cohorts=cohort_rows(services),
        kill_switch=ks,
        stale_engines=[v for v in engines if v.stale],
        num_engines=len(engines),
        now=utcnow(),
        message=message,
        error=error,
        rollout=rollout_view(services, user),
    )


ShareQuery = Annotated[int, Query(ge=0, le=100)]


@router.get("/canaries/{cohort}/confirm", response_class=HTMLResponse)
def confirm_flip(
    request: Request,
    cohort: str,
    enabled: bool,
    services: ServicesDep,
    user: UserDep,
    percentage: ShareQuery = 100,
) -> HTMLResponse:
    """The htmx fragment: impact preview at the share in the form (100% unless given), a
    warning when the cohort's parity evidence reads fail, reason field, confirm button
    (operator, as the flip itself: a viewer who opens the URL gets a 403 without the
    button)."""
    return _preview(request, services, user, cohort, enabled, percentage, "_confirm.html")


@router.get("/canaries/{cohort}/impact", response_class=HTMLResponse)
def impact_fragment(
    request: Request,
    cohort: str,
    enabled: bool,
    services: ServicesDep,
    user: UserDep,
    percentage: Annotated[str, Query(max_length=8)] = "100",
) -> HTMLResponse:
    """The confirm form's impact line again, for the share as typed (the form asks for it on
    every change); a share that is not 0..100 answers 422 with the line saying so."""
    share = int(percentage) if percentage.strip().isascii() and percentage.strip().isdigit() else -1
    if not 0 <= share <= 100:
        return render(request, "_impact.html", user, status=422, bad_share=percentage[:8])
    return _preview(request, services, user, cohort, enabled, share, "_impact.html")


def _preview(
    request: Request,
    services: Services,
    user: Principal,
    cohort: str,
    enabled: bool,
    share: int,
    template: str,
) -> HTMLResponse:
    if not user.role.allows(Role.operator):  # as the flip itself: no form, no button
        return HTMLResponse(
            f"<p class=error>Flipping a canary needs the operator role; "
            f"{html.escape(user.name)} has {user.role.value}.</p>",
            status_code=403,
        )
    try:
        preview = flip_preview(services, cohort, enabled, share)
    except StoreError as err:
        return HTMLResponse(
            f"<p class=error>{html.escape(services.policy.store_error_text(cohort, err))}</p>",
            status_code=404,
        )
    return render(
        request,
        template,
        user,
        cohort=cohort,
        enabled=enabled,
        preview=preview,
        version=preview.row.version,
    )


def _back(request: Request, message: str = "", error: str = "") -> RedirectResponse:
    """Back to the Canaries page with a status line, signed for the signed-in token (the page
    shows no status line from a URL it did not sign)."""
    sig = flash_signature(request.cookies.get(COOKIE_NAME, ""), message, error)
    query = {k: v for k, v in {"message": message, "error": error}.items() if v}
    return RedirectResponse("/canaries?" + urlencode({**query, "sig": sig}), status_code=303)


def _refused(
    request: Request, user: Principal, csrf: str, needed: Role, what: str
) -> HTMLResponse | None:
    """403 for a form without its CSRF field or from a role below ``needed``; else None."""
    if not csrf_ok(request.cookies.get(COOKIE_NAME, ""), csrf):
        return HTMLResponse("bad CSRF field: reload the page", status_code=403)
    if not user.role.allows(needed):
        return HTMLResponse(f"{what} needs the {needed.value} role", status_code=403)
    return None


@router.post("/canaries/{cohort}", response_model=None)
def flip_from_page(
    request: Request,
    cohort: str,
    services: ServicesDep,
    user: UserDep,
    enabled: Annotated[bool, Form()],
    version: Annotated[int, Form()],
    reason: Annotated[str, Form(max_length=audit.MAX_REASON_CHARS)] = "",
    csrf: Annotated[str, Form()] = "",
    percentage: Annotated[int | None, Form(ge=0, le=100)] = None,
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, "flipping a canary")
    if refused is not None:
        return refused
    from turnout.dashboard.store import schedule

    try:
        with services.db.write_session() as session:
            flip = schedule.flip_or_request(
                session=session,
                cohort=cohort,
                enabled=enabled,
                reason=reason,
                actor=user.actor,
                requester=user.name,
                if_version=version,
                percentage=percentage if enabled else None,
                require_approval=services.require_approval(),
            )
            session.commit()
    except StoreError as err:  # a stale version, an empty reason, an unknown cohort
        return _back(request, error=services.policy.store_error_text(cohort, err))
    if not isinstance(flip, canary_store.Flip):
        return _back(
            request, message=f"{cohort}: waiting for another operator's approval (flip {flip.id})"
        )
    row = flip.canary
    state = f"enabled at {row.percentage}%" if row.enabled else "disabled"
    if not flip.changed:
        return _back(request, message=f"{cohort} already {state}: nothing changed")
    services.policy.invalidate()
    services.metrics.canary_flips.labels(cohort).inc()
    return _back(request, message=f"{cohort} {state}: {reason.strip()}")


@router.post("/kill-switch", response_model=None)
def kill_switch_from_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    engaged: Annotated[bool, Form()],
    reason: Annotated[str, Form(max_length=audit.MAX_REASON_CHARS)] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, "the kill switch")
    if refused is not None:
        return refused
    try:
        with services.write_gate.control(), services.db.write_session() as session:
            result = canary_store.set_kill_switch(
                session=session, engaged=engaged, reason=reason, actor=user.actor
            )
            session.commit()
    except StoreError as err:
        return _back(request, error=str(err))
    state = "engaged" if engaged else "released"
    if not result.changed:
        return _back(request, message=f"kill switch already {state}: nothing changed")
    services.policy.invalidate()
    return _back(request, message=f"kill switch {state}")


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> HTMLResponse:
    with services.db.read_session() as session:
        entries = audit.list_entries(session=session, limit=100, before_id=before_id)
    return render(request, "audit.html", user, entries=entries)


@router.get("/matrix", response_class=HTMLResponse)
def matrix_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    pin: Annotated[str, Query(pattern="^(auto|v1|v2)$")] = "auto",
) -> HTMLResponse:
    summary = services.policy.matrix()
    return render(
        request, "matrix.html", user, summary=summary, pin=pin, grid=summary.grid.get(pin, {})
    )


@router.get("/explain", response_class=HTMLResponse)
def explain_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    command: Annotated[str, Query(max_length=20_000)] = "",
    config: Annotated[str, Query(max_length=20_000)] = "",
) -> HTMLResponse:
    """Explain a pasted ``vllm serve`` command, or a deployment's inputs as JSON spec fields
    (``config``: what a deployment's page links here with)."""
    from turnout.dashboard.policy import config_from_request
    from turnout.oracle import OracleError

    context: dict[str, Any] = {"command": command, "config": config}
    try:
        if command.strip() and config.strip():
            raise ValueError("give a command or inputs (JSON), not both")
        if command.strip() or config.strip():
            deployment = config_from_request(
                command=command if command.strip() else None,
                config=_spec_object(config) if config.strip() else None,
                hint_for="page",
                release=services.policy.release,
                offline=not services.settings.hub_online,
            )
            context["explanation"] = services.policy.explain(deployment).to_json()
    except (OracleError, ValueError) as err:
        context["error"] = str(err)
    return render(
        request, "explain.html", user, status=422 if "error" in context else 200, **context
    )


def _spec_object(text: str) -> dict[str, Any]:
    """The inputs field: a JSON object of spec fields. Raises ValueError saying what it is."""
    try:
        value = bounded_json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"inputs: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from None
    except bounded_json.TooDeepError as err:
        raise ValueError(f"inputs: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"inputs: a JSON object of spec fields, not a {type(value).__name__}")
    return value


@router.get("/upgrade", response_class=HTMLResponse)
def upgrade_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    from_pack: Annotated[str, Query(alias="from", max_length=64)] = "",
    to_pack: Annotated[str, Query(alias="to", max_length=64)] = "",
) -> HTMLResponse:
    """The upgrade preview (dashboard.upgrade); an unknown pack is a 422 page saying which."""
    from turnout.dashboard.upgrade import default_packs, pack_names, upgrade_preview
    from turnout.oracle import OracleError

    chosen = default_packs(from_pack or None, to_pack or None)
    context: dict[str, Any] = {"packs": pack_names(), "from_pack": chosen[0], "to_pack": chosen[1]}
    try:
        context["preview"] = upgrade_preview(services, *chosen)
    except OracleError as err:
        return render(request, "upgrade.html", user, status=422, error=err.message, **context)
    return render(request, "upgrade.html", user, **context)
