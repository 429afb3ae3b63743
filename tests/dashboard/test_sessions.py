"""Page sessions, sign-in CSRF, expiring tokens, security headers and the pages' role checks,
on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_helpers import Api, role_tokens, sign_in
from sqlalchemy import select, text, update

from turnout.dashboard.app import create_app
from turnout.dashboard.auth import COOKIE_NAME, SIGN_IN_COOKIE
from turnout.dashboard.security import CONTENT_SECURITY_POLICY
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.dashboard.store import sessions, tokens
from turnout.dashboard.store.models import ApiToken, PageSession
from turnout.oracle.errors import ErrorCode


def _set_cookies(r: Any) -> dict[str, str]:
    """Set-Cookie header of ``r`` per cookie name (the whole header line)."""
    return {line.split("=", 1)[0]: line for line in r.headers.get_list("set-cookie")}


def _nonce(api: Api) -> str:
    found = re.search(r'name="nonce" value="([^"]+)"', api.client.get("/login").text)
    assert found is not None
    return found.group(1)


def test_the_cookie_holds_a_session_id_not_the_token(api: Api) -> None:
    # Before: the cookie was the raw API token, for 7 days.
    api.client.cookies.clear()
    r = api.client.post(
        "/login", data={"token": api.tokens["viewer"], "nonce": _nonce(api)}, follow_redirects=False
    )
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = _set_cookies(r)[COOKIE_NAME]
    session_id = api.client.cookies[COOKIE_NAME]
    assert session_id.startswith("ses_") and api.tokens["viewer"] not in cookie
    ttl = int(api.services.settings.session_ttl_s)
    assert f"Max-Age={ttl}" in cookie and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie and "Secure" not in cookie
    with api.services.db.read_session() as s:
        (row,) = s.scalars(select(PageSession)).all()
    assert row.id_hash == sessions.hash_session_id(session_id) and session_id not in row.id_hash
    assert abs((row.expires_at - row.created_at).total_seconds() - ttl) < 1
    assert api.client.get("/").status_code == 200


def test_sign_out_ends_the_session_in_the_store(api: Api) -> None:
    # Before: sign-out only cleared the cookie; a copy of it went on working.
    csrf = api.sign_in("operator")
    copied = api.client.cookies[COOKIE_NAME]
    refused = api.client.post("/logout", data={"csrf": "nope"}, follow_redirects=False)
    assert refused.status_code == 403
    assert api.client.get("/", follow_redirects=False).status_code == 200  # still signed in
    r = api.client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    api.client.cookies.set(COOKIE_NAME, copied)
    r = api.client.get("/", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    r = api.client.get("/api/v1/canaries")  # the API's reads take the cookie no more either
    assert r.status_code == 401 and r.json()["detail"]["code"] == ErrorCode.BAD_TOKEN
    api.client.cookies.clear()


def test_a_session_ends_at_its_expiry_and_with_its_token(api: Api) -> None:
    api.sign_in("operator")
    assert api.client.get("/api/v1/canaries").status_code == 200  # reads by cookie
    with api.services.db.write_session() as s:
        s.execute(
            update(PageSession).values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
        )
        s.commit()
    assert api.client.get("/", follow_redirects=False).headers["location"] == "/login"
    api.sign_in("operator")
    operator_id = next(
        t["id"]
        for t in api.client.get("/api/v1/tokens", headers=api.h("admin")).json()
        if t["name"] == "operator"
    )
    r = api.client.post(
        f"/api/v1/tokens/{operator_id}/revoke", json={"reason": "left"}, headers=api.h("admin")
    )
    assert r.status_code == 200
    assert api.client.get("/", follow_redirects=False).headers["location"] == "/login"
    api.client.cookies.clear()


@pytest.mark.parametrize("case", ["no nonce", "another nonce", "no cookie", "other origin"])
def test_sign_in_refuses_a_form_it_did_not_serve(api: Api, case: str) -> None:
    # Before: /login took any POST (login CSRF: a site could sign a victim in as itself).
    api.client.cookies.clear()
    nonce = _nonce(api)
    data = {"token": api.tokens["admin"], "nonce": nonce}
    headers = {}
    if case == "no nonce":
        del data["nonce"]
    elif case == "another nonce":
        data["nonce"] = "x" * len(nonce)
    elif case == "no cookie":
        api.client.cookies.clear()
    else:
        headers["Origin"] = "https://evil.example"
    r = api.client.post("/login", data=data, headers=headers, follow_redirects=False)
    assert r.status_code == 403, r.text
    assert "The sign-in form expired or came from another site" in r.text
    assert COOKIE_NAME not in api.client.cookies
    ok = api.client.post(
        "/login",
        headers={"Origin": "http://testserver"},
        data={"token": api.tokens["admin"], "nonce": _nonce(api)},
        follow_redirects=False,
    )
    assert ok.status_code == 303  # the same origin, a fresh form: signed in
    with api.services.db.read_session() as s:
        assert len(s.scalars(select(PageSession)).all()) == 1
    api.client.cookies.clear()


def test_a_viewer_opening_a_confirm_url_gets_no_confirm_button(api: Api) -> None:
    # Before: the fragment rendered the form with its Confirm button for any signed-in user.
    api.sign_in("viewer")
    r = api.client.get("/canaries/qwen3-canary/confirm?enabled=true")
    assert r.status_code == 403
    assert "Confirm" not in r.text and "<form" not in r.text
    assert "needs the operator role; viewer has viewer" in r.text
    api.sign_in("operator")
    r = api.client.get("/canaries/qwen3-canary/confirm?enabled=true")
    assert r.status_code == 200 and "Confirm</button>" in r.text
    api.client.cookies.clear()


@pytest.fixture
def https_api(db_url: str) -> Iterator[Api]:
    services = Services.build(
        Settings(database_url=db_url, demo=False, https=True, session_ttl_s=600)
    )
    with TestClient(create_app(services=services), base_url="https://testserver") as client:
        yield Api(client, services, role_tokens(services.db))


def test_over_https_the_cookies_are_secure_and_hsts_is_sent(https_api: Api) -> None:
    form = https_api.client.get("/login")
    assert "Secure" in _set_cookies(form)[SIGN_IN_COOKIE]
    assert form.headers["strict-transport-security"] == "max-age=31536000"
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    r = https_api.client.post(
        "/login",
        follow_redirects=False,
        data={"token": https_api.tokens["viewer"], "nonce": nonce.group(1)},
    )
    cookie = _set_cookies(r)[COOKIE_NAME]
    assert "Secure" in cookie and "Max-Age=600" in cookie


@pytest.mark.parametrize(
    "path",
    [
        "/login",
        "/api/v1/canaries",
        "/healthz",
        "/metrics",
        "/static/style.css",
        "/api/v1/docs",
        "/api/v1/nope",
        "/api/v1/openapi.json",
    ],
)
def test_every_response_carries_the_security_headers(api: Api, path: str) -> None:
    # Before: no X-Frame-Options, CSP, nosniff or Referrer-Policy anywhere.
    r = api.client.get(path, headers=api.h("viewer"))
    assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "same-origin"
    assert "strict-transport-security" not in r.headers  # not served over HTTPS here


def test_signed_in_pages_are_not_cached(api: Api) -> None:
    api.sign_in("viewer")
    assert api.client.get("/canaries").headers["cache-control"] == "no-store"
    api.client.cookies.clear()


def _expire(api: Api, name: str) -> None:
    with api.services.db.write_session() as s:
        s.execute(
            update(ApiToken)
            .where(ApiToken.name == name)
            .values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
        )
        s.commit()
    api.services.verifier.forget_all()


def test_an_expired_token_is_a_401_that_says_so(api: Api) -> None:
    r = api.client.post(
        "/api/v1/tokens",
        json={"name": "ci", "role": "operator", "expires_in": "30d"},
        headers=api.h("admin"),
    )
    assert r.status_code == 201, r.text
    made = r.json()
    expires = dt.datetime.fromisoformat(made["expires_at"])
    assert abs(expires - dt.datetime.now(dt.UTC) - dt.timedelta(days=30)) < dt.timedelta(minutes=1)
    auth = {"Authorization": f"Bearer {made['token']}"}
    assert api.client.get("/api/v1/canaries", headers=auth).status_code == 200
    _expire(api, "ci")
    r = api.client.get("/api/v1/canaries", headers=auth)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    detail = r.json()["detail"]
    assert detail["code"] == ErrorCode.TOKEN_EXPIRED
    assert detail["message"].startswith(f"token {made['prefix']}… (ci) expired at ")
    assert "token create --role operator" in detail["message"]
    # and at sign-in
    api.client.cookies.clear()
    r = api.client.post("/login", data={"token": made["token"], "nonce": _nonce(api)})
    assert r.status_code == 401 and f"token {made['prefix']}… (ci) expired at" in r.text


def test_a_cached_token_expires_on_time(api: Api) -> None:
    # The verifier trusts a token for token_cache_ttl_s (5 s); its expiry is checked on every
    # use, so a token cached a moment before it expires is refused at once.
    with api.services.db.write_session() as s:
        _row, token = tokens.create_token(
            session=s,
            name="soon",
            role=tokens.Role.viewer,
            actor="t",
            expires_in=dt.timedelta(seconds=1),
        )
        s.commit()
    verifier = api.services.verifier
    assert verifier.verify(token) is not None
    time.sleep(1.1)
    hit, result = verifier.cached(token)
    assert hit and getattr(result, "code", None) == ErrorCode.TOKEN_EXPIRED


@pytest.mark.parametrize("value", ["30", "0d", "3661d", "1y", "-1h", "x" * 17])
def test_a_lifetime_that_is_not_a_duration_is_a_422(api: Api, value: str) -> None:
    r = api.client.post(
        "/api/v1/tokens",
        json={"name": "n", "role": "viewer", "expires_in": value},
        headers=api.h("admin"),
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["code"] in (ErrorCode.INVALID_CHANGE, ErrorCode.INVALID_REQUEST)
    assert all(
        t["name"] != "n" for t in api.client.get("/api/v1/tokens", headers=api.h("admin")).json()
    )


@pytest.mark.parametrize(
    "text_, seconds",
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("2w", 14 * 86400), ("45s", 45)],
)
def test_durations(text_: str, seconds: int) -> None:
    assert tokens.parse_duration(text_) == dt.timedelta(seconds=seconds)


def test_sign_in_helper_and_sessions_of_expired_tokens(api: Api) -> None:
    csrf = sign_in(api.client, api.tokens["admin"])
    assert len(csrf) == 32
    _expire(api, "admin")  # its page session ends with it
    assert api.client.get("/", follow_redirects=False).headers["location"] == "/login"
    api.client.cookies.clear()


def test_migration_0003_keeps_the_tokens_made_before_it(db_url: str) -> None:
    from alembic import command

    from turnout.dashboard.store.db import Database, alembic_config

    db = Database(db_url)
    with db.engine.begin() as conn:
        cfg = alembic_config(db_url)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        conn.execute(
            text(
                "INSERT INTO api_tokens (name, role, token_hash, prefix, created_at, created_by) "
                "VALUES ('old', 'viewer', :h, 'tok_old', :at, 't')"
            ),
            {"h": tokens.hash_token("tok_old-token"), "at": dt.datetime.now(dt.UTC)},
        )
    db.upgrade()
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
    assert db.current_revision() == head  # 0003 and every later one
    with db.read_session() as s:
        row = tokens.verify_token(session=s, token="tok_old-token")
        assert row is not None and row.expires_at is None  # never expires
        assert s.scalars(select(PageSession)).all() == []
    with db.engine.begin() as conn:
        cfg = alembic_config(db_url)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
    assert db.current_revision() == "0002"
    db.upgrade()
    db.dispose()


def test_the_templates_hold_nothing_the_csp_refuses() -> None:
    # The browser tests (test_pages.py) fail on any console error, CSP violations included;
    # this says which template line to change before a browser is started.
    from pathlib import Path

    from turnout import dashboard

    templates = Path(dashboard.__file__).parent / "templates"
    found = []
    for path in sorted(templates.glob("*.html")):
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            scripts = [
                t
                for t in re.findall(r"<script[^>]*>", line)
                if "src=" not in t and 'type="application/json"' not in t
            ]
            if scripts or re.search(r"\sstyle=|<style|\son[a-z]+=|javascript:", line):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert len(list(templates.glob("*.html"))) > 5 and found == []


@pytest.mark.parametrize("value", ["é", "ключ", "😀" * 40], ids=["latin-1", "cyrillic", "emoji"])
def test_secrets_with_non_ascii_text_are_refused_not_a_500(api: Api, value: str) -> None:
    # Before: hmac.compare_digest(str, str) raised TypeError on non-ASCII text, so a nonce,
    # a CSRF field or a status-line signature of that kind gave a 500, even with no
    # credentials at all.
    api.client.cookies.clear()
    _nonce(api)  # the sign-in cookie is set
    r = api.client.post("/login", data={"nonce": value}, follow_redirects=False)
    assert r.status_code == 403, r.text
    r = api.client.post("/login", data={"token": "x", "nonce": value}, follow_redirects=False)
    assert r.status_code == 403, r.text
    api.sign_in("admin")
    r = api.client.post("/logout", data={"csrf": value}, follow_redirects=False)
    assert r.status_code == 403, r.text
    r = api.client.get("/webhooks", params={"message": "forged", "sig": value})
    assert r.status_code == 200 and "forged" not in r.text
    assert api.client.get("/", follow_redirects=False).status_code == 200  # still signed in
    api.client.cookies.clear()


def test_the_explain_page_refuses_inputs_nested_too_deep(api: Api) -> None:
    # Before: 19,999 "[" in ?config= raised RecursionError from json.loads: a 500.
    api.sign_in("viewer")
    r = api.client.get("/explain", params={"config": "[" * 19_999})
    assert r.status_code == 422, r.text[:300]
    assert "nested 19999 levels deep; at most 64 are accepted" in r.text
    api.client.cookies.clear()
