"""The pages' forms of the closed loop (ramps, approvals, scheduled flips: operators) and the
Webhooks page with its outbox (admins). Each form carries the session's CSRF field and checks
the role again, as the flip forms do; each change goes through the store functions the API
uses, so it is audited and notified the same way."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from turnout.dashboard.auth import COOKIE_NAME, Principal, flash_ok, flash_signature
from turnout.dashboard.deps import MAX_BODY, MAX_ID, ServicesDep
from turnout.dashboard.pages import UserDep, _back, _refused, render
from turnout.dashboard.services import Services
from turnout.dashboard.store import approvals, audit, ramps, schedule, webhooks
from turnout.dashboard.store.errors import StoreError
from turnout.dashboard.store.tokens import Role

router = APIRouter(include_in_schema=False, max_body_size=MAX_BODY)
ReasonForm = Annotated[str, Form(max_length=audit.MAX_REASON_CHARS)]
CsrfForm = Annotated[str, Form(max_length=200)]
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]


def parse_shares(text: str) -> list[int]:
    """``10,25,50,100`` → the shares. Raises ValueError saying which part is not one."""
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if not (p.isascii() and p.isdigit() and len(p) <= 3)]
    if bad:
        raise ValueError(f"shares: {bad[0]!r} is not a share (10,25,50,100)")
    return [int(p) for p in parts]


@router.post("/canaries/{cohort}/ramp", response_model=None)
def start_ramp(
    request: Request,
    cohort: str,
    services: ServicesDep,
    user: UserDep,
    version: Annotated[int, Form(ge=0, le=MAX_ID)],
    steps: Annotated[str, Form(max_length=200)],
    bake_min: Annotated[int, Form(ge=0, le=43_200)],
    on_failure: Annotated[Literal["pause", "rollback"], Form()] = "pause",
    reason: ReasonForm = "",
    csrf: CsrfForm = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, "starting a ramp")
    if refused is not None:
        return refused
    try:
        shares = parse_shares(steps)
        with services.db.write_session() as session:
            ramp = ramps.request_ramp(
                session=session,
                cohort=cohort,
                steps=[{"percentage": p, "bake_s": bake_min * 60} for p in shares],
                gates=services.settings.ramp_gates,
                on_failure=on_failure,
                reason=reason,
                actor=user.actor,
                requester=user.name,
                if_version=version,
                needs_approval=services.require_approval(),
            )
            session.commit()
    except ValueError as err:
        return _back(request, error=str(err))
    except StoreError as err:
        return _back(request, error=services.policy.store_error_text(cohort, err))
    if ramp.state == ramps.RampState.pending_approval:
        return _back(
            request, message=f"ramp {ramp.id} of {cohort}: waiting for another operator's approval"
        )
    services.policy.invalidate()
    return _back(
        request, message=f"ramp {ramp.id} of {cohort}: started at {ramp.steps[0]['percentage']}%"
    )


@router.post("/ramps/{ramp_id}/{what}", response_model=None)
def change_ramp(
    request: Request,
    ramp_id: IdPath,
    what: Literal["cancel", "resume"],
    services: ServicesDep,
    user: UserDep,
    version: Annotated[int, Form(ge=0, le=MAX_ID)],
    reason: ReasonForm = "",
    csrf: CsrfForm = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, f"to {what} a ramp")
    if refused is not None:
        return refused
    change = ramps.cancel_ramp if what == "cancel" else ramps.resume_ramp
    try:
        with services.db.write_session() as session:
            ramp = change(
                session=session,
                ramp_id=ramp_id,
                actor=user.actor,
                reason=reason,
                if_version=version,
            )
            session.commit()
    except StoreError as err:
        return _back(request, error=str(err))
    return _back(request, message=f"ramp {ramp.id} of {ramp.cohort}: {ramp.state}")


@router.post("/approvals/{subject}/{item_id}/{decision}", response_model=None)
def decide(
    request: Request,
    subject: Literal["ramp", "flip"],
    item_id: IdPath,
    decision: Literal["approve", "reject"],
    services: ServicesDep,
    user: UserDep,
    reason: ReasonForm = "",
    csrf: CsrfForm = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, f"to {decision} a change")
    if refused is not None:
        return refused
    try:
        with services.db.write_session() as session:
            if decision == "approve":
                approvals.approve(
                    session=session,
                    subject=subject,
                    item_id=item_id,
                    actor=user.actor,
                    approver=user.name,
                    reason=reason,
                )
            else:
                approvals.reject(
                    session=session,
                    subject=subject,
                    item_id=item_id,
                    actor=user.actor,
                    reason=reason,
                )
            session.commit()
    except StoreError as err:
        return _back(request, error=str(err))
    services.policy.invalidate()
    return _back(request, message=f"{subject} {item_id}: {decision.rstrip('e')}ed")


def _utc(text: str) -> dt.datetime:
    """A ``datetime-local`` field's value (``2026-12-07T09:00``), read as UTC; one with an
    offset keeps it. Raises ValueError."""
    when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


@router.post("/scheduled-flips", response_model=None)
def schedule_flip(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    cohort: Annotated[str, Form(max_length=64)],
    enabled: Annotated[bool, Form()],
    run_at: Annotated[str, Form(max_length=40)],
    percentage: Annotated[int | None, Form(ge=0, le=100)] = None,
    reason: ReasonForm = "",
    csrf: CsrfForm = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, "scheduling a flip")
    if refused is not None:
        return refused
    try:
        when = _utc(run_at)
        with services.db.write_session() as session:
            flip = schedule.request_flip(
                session=session,
                cohort=cohort,
                enabled=enabled,
                percentage=percentage,
                reason=reason,
                actor=user.actor,
                requester=user.name,
                run_at=when,
                if_version=None,
                needs_approval=services.require_approval() and enabled,
            )
            session.commit()
    except ValueError:
        return _back(request, error=f"at: {run_at[:40]!r} is not a time")
    except StoreError as err:
        return _back(request, error=services.policy.store_error_text(cohort, err))
    return _back(
        request,
        message=f"flip {flip.id} of {cohort} at "
        f"{when:%Y-%m-%d %H:%M} UTC: {flip.state.replace('_', ' ')}",
    )


@router.post("/scheduled-flips/{flip_id}/cancel", response_model=None)
def cancel_flip(
    request: Request,
    flip_id: IdPath,
    services: ServicesDep,
    user: UserDep,
    version: Annotated[int, Form(ge=0, le=MAX_ID)],
    reason: ReasonForm = "",
    csrf: CsrfForm = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.operator, "cancelling a flip")
    if refused is not None:
        return refused
    try:
        with services.db.write_session() as session:
            flip = schedule.cancel_flip(
                session=session,
                flip_id=flip_id,
                actor=user.actor,
                reason=reason,
                if_version=version,
            )
            session.commit()
    except StoreError as err:
        return _back(request, error=str(err))
    return _back(request, message=f"flip {flip.id} of {flip.cohort}: cancelled")


def _to_webhooks(request: Request, message: str = "", error: str = "") -> RedirectResponse:
    sig = flash_signature(request.cookies.get(COOKIE_NAME, ""), message, error)
    query = {k: v for k, v in {"message": message, "error": error}.items() if v}
    return RedirectResponse("/webhooks?" + urlencode({**query, "sig": sig}), status_code=303)


def _webhooks_page(
    request: Request,
    services: Services,
    user: Principal,
    *,
    state: str = "",
    message: str = "",
    error: str = "",
    secret: str = "",
    status: int = 200,
) -> HTMLResponse:
    if not user.role.allows(Role.admin):
        return HTMLResponse("the Webhooks page needs the admin role", status_code=403)
    with services.db.read_session() as session:
        hooks = webhooks.list_webhooks(session=session)
        counts = webhooks.outbox_counts(session=session)
        entries = webhooks.list_outbox(session=session, state=state or None, limit=100)
    return render(
        request,
        "webhooks.html",
        user,
        status=status,
        hooks=hooks,
        counts=counts,
        entries=entries,
        state=state,
        message=message,
        error=error,
        secret=secret,
        kinds=[k.value for k in webhooks.Kind],
    )


@router.get("/webhooks", response_class=HTMLResponse)
def webhooks_page(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    state: Annotated[str, Query(pattern="^(|pending|delivered|dead)$")] = "",
    message: str = "",
    error: str = "",
    sig: str = "",
) -> HTMLResponse:
    """Subscriptions, the outbox's counts and its latest deliveries (admin)."""
    if not flash_ok(request.cookies.get(COOKIE_NAME, ""), message, error, sig):
        message = error = ""
    return _webhooks_page(request, services, user, state=state, message=message, error=error)


@router.post("/webhooks", response_model=None)
def add_webhook(
    request: Request,
    services: ServicesDep,
    user: UserDep,
    url: Annotated[str, Form(max_length=webhooks.MAX_URL_CHARS)],
    kinds: Annotated[list[str], Form(max_length=6)],
    description: Annotated[str, Form(max_length=256)] = "",
    csrf: CsrfForm = "",
) -> Response:
    """Subscribe (admin); the answer is the page itself, showing the secret once (a redirect
    would carry it in a URL)."""
    refused = _refused(request, user, csrf, Role.admin, "adding a webhook")
    if refused is not None:
        return refused
    try:
        with services.db.write_session() as session:
            row, secret = webhooks.add_webhook(
                session=session,
                url=url,
                kinds=kinds,
                actor=user.actor,
                egress=services.settings.egress,
                description=description,
            )
            session.commit()
    except StoreError as err:
        return _webhooks_page(request, services, user, error=str(err), status=422)
    return _webhooks_page(
        request, services, user, secret=secret, message=f"webhook {row.id} added: {row.url}"
    )


@router.post("/webhooks/{webhook_id}/remove", response_model=None)
def remove_webhook(
    request: Request,
    webhook_id: IdPath,
    services: ServicesDep,
    user: UserDep,
    reason: ReasonForm = "",
    csrf: CsrfForm = "",
) -> Response:
    refused = _refused(request, user, csrf, Role.admin, "removing a webhook")
    if refused is not None:
        return refused
    try:
        with services.db.write_session() as session:
            row = webhooks.remove_webhook(
                session=session, webhook_id=webhook_id, actor=user.actor, reason=reason
            )
            session.commit()
    except StoreError as err:
        return _to_webhooks(request, error=str(err))
    return _to_webhooks(request, message=f"webhook {row.id} removed")


@router.post("/webhooks/outbox/{entry_id}/retry", response_model=None)
def retry_delivery(
    request: Request, entry_id: IdPath, services: ServicesDep, user: UserDep, csrf: CsrfForm = ""
) -> Response:
    refused = _refused(request, user, csrf, Role.admin, "retrying a delivery")
    if refused is not None:
        return refused
    try:
        with services.db.write_session() as session:
            row = webhooks.retry_dead(session=session, entry_id=entry_id, actor=user.actor)
            session.commit()
    except StoreError as err:
        return _to_webhooks(request, error=str(err))
    return _to_webhooks(request, message=f"delivery {row.id} is pending again")
