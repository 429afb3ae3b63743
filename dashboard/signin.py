"""Signing in and out of the pages: a token once, then a server-side session.

The sign-in form is protected against cross-site posting by a nonce it carries and a cookie of
its own must match (double-submit: another site can post the form, but can neither read nor
set the cookie), and by its ``Origin`` when the browser sends one. A good token starts a
session (dashboard.store.sessions); its random id, never the token, is the cookie (HttpOnly,
SameSite=Strict, ``Secure`` with ``TURNOUT_HTTPS``, lasting ``session_ttl_s``). Signing out
ends the session in the store, so a copied cookie stops working too.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from turnout.dashboard.auth import (
    COOKIE_NAME,
    SIGN_IN_COOKIE,
    UNKNOWN_TOKEN,
    Principal,
    Refusal,
    csrf_ok,
    new_sign_in_nonce,
    same_origin,
    sign_in_nonce_ok,
)
from turnout.dashboard.deps import MAX_BODY, ServicesDep
from turnout.dashboard.pages import render
from turnout.dashboard.services import Services
from turnout.dashboard.store import sessions
from turnout.dashboard.store.models import ApiToken
from turnout.oracle.errors import ErrorCode

router = APIRouter(include_in_schema=False, max_body_size=MAX_BODY)
SIGN_IN_FORM_TTL_S = 3600


def _cookie(
    response: Response, services: Services, name: str, value: str, max_age: int, path: str = "/"
) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        max_age=max_age,
        path=path,
        secure=services.settings.https,
    )


def _sign_in_page(
    request: Request, services: Services, status: int = 200, error: str = ""
) -> HTMLResponse:
    """The sign-in form with a fresh nonce, also set as its cookie (double-submit: another
    site can post the form but can neither read nor set the cookie)."""
    nonce = new_sign_in_nonce()
    response = render(request, "login.html", None, status=status, error=error, nonce=nonce)
    _cookie(response, services, SIGN_IN_COOKIE, nonce, SIGN_IN_FORM_TTL_S, path="/login")
    return response


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, services: ServicesDep) -> HTMLResponse:
    return _sign_in_page(request, services)


@router.post("/login", response_model=None)
def login(
    request: Request,
    services: ServicesDep,
    token: Annotated[str, Form(max_length=200)] = "",
    nonce: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    """Sign in: the form's nonce and origin are checked (CSRF), then the token; a session is
    started and its id (not the token) set as the cookie."""
    if not (
        sign_in_nonce_ok(request.cookies.get(SIGN_IN_COOKIE), nonce)
        and same_origin(request.headers.get("origin"), request.headers.get("host"))
    ):
        return _sign_in_page(
            request,
            services,
            403,
            "The sign-in form expired or came from another site: sign in again from this page.",
        )
    result = services.verifier.authenticate(token.strip()) if token.strip() else UNKNOWN_TOKEN
    if isinstance(result, Refusal):
        why = (
            result.message
            if result.code == ErrorCode.TOKEN_EXPIRED
            else ("Unknown or revoked token.")
        )
        return _sign_in_page(request, services, 401, why)
    session_id = _start_session(services, result)
    response = RedirectResponse("/", status_code=303)
    _cookie(response, services, COOKIE_NAME, session_id, int(services.settings.session_ttl_s))
    response.delete_cookie(
        SIGN_IN_COOKIE,
        path="/login",
        httponly=True,
        samesite="strict",
        secure=services.settings.https,
    )
    return response


def _start_session(services: Services, principal: Principal) -> str:
    ttl = dt.timedelta(seconds=services.settings.session_ttl_s)
    with services.db.write_session() as session:
        token = session.get(ApiToken, principal.token_id)
        assert token is not None  # it was just verified; tokens are never deleted
        session_id, _row = sessions.start_session(session=session, token=token, ttl=ttl)
        session.commit()
    return session_id


@router.post("/logout", response_model=None)
def logout(
    request: Request, services: ServicesDep, csrf: Annotated[str, Form(max_length=100)] = ""
) -> Response:
    """Sign out: the session ends in the store (its cookie is refused from now on, wherever
    it was copied to) and the cookie is cleared."""
    session_id = request.cookies.get(COOKIE_NAME, "")
    if session_id and services.verifier.session_principal(session_id) is not None:
        if not csrf_ok(session_id, csrf):
            return HTMLResponse("bad CSRF field: reload the page", status_code=403)
        with services.db.write_session() as session:
            sessions.end_session(session=session, session_id=session_id)
            session.commit()
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        COOKIE_NAME, httponly=True, samesite="strict", secure=services.settings.https
    )
    return response
