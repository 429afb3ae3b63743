"""Every mutating endpoint x {no token, bad token, viewer, engine, operator, admin}: the exact
status.

The API takes bearer tokens only for changes; the pages' form handlers take the session cookie
and a CSRF field. A forbidden call must change nothing (checked through the audit log).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_helpers import role_tokens, sign_in

from turnout.dashboard.app import create_app
from turnout.dashboard.auth import COOKIE_NAME
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import engine_registration

IDENTITIES = ["none", "bad", "viewer", "engine", "operator", "admin"]
RANK = {"viewer": 0, "engine": 1, "operator": 2, "admin": 3}


@dataclass
class Ctx:
    client: TestClient
    tokens: dict[str, str]
    # the audit log's length just before the call under test, when its setup wrote entries
    mark: int | None = None

    @property
    def services(self) -> Services:
        services: Services = self.client.app.state.services  # type: ignore[attr-defined]
        return services


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    path = tmp_path_factory.mktemp("auth") / "auth.db"
    services = Services.build(
        Settings(
            database_url=f"sqlite:///{path}", demo=False, snapshot_ttl_s=0, token_cache_ttl_s=0
        )
    )
    with TestClient(create_app(services=services)) as client:
        made = role_tokens(services.db)
        made["bad"] = "tok_" + "x" * 43
        yield Ctx(client, made)


def _first(c: Ctx) -> dict[str, Any]:
    body = c.client.get(
        "/api/v1/canaries", headers={"Authorization": f"Bearer {c.tokens['viewer']}"}
    ).json()
    return dict(body["cohorts"][0])


def _cohort(c: Ctx) -> tuple[str, int]:
    first = _first(c)
    return first["cohort"], first["version"]


def _toggled(c: Ctx) -> str:
    """The first cohort's opposite state as a form value (a flip to the same state is no
    change, and writes no audit entry)."""
    return "false" if _first(c)["enabled"] else "true"


def _kill_toggled(c: Ctx) -> bool:
    """The kill switch's opposite state (setting the state it has is no change either)."""
    body = c.client.get(
        "/api/v1/canaries", headers={"Authorization": f"Bearer {c.tokens['viewer']}"}
    ).json()
    return not body["kill_switch"]["engaged"]


def _event() -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "deployment_id": "d",
        "pack": "turnout",
        "family": "qwen3",
        "runner": "v2",
        "mode": "auto",
        "reason_code": "DEFAULT",
    }


def _registration(engine_id: str) -> dict[str, Any]:
    config = from_spec({"architecture": "Qwen3ForCausalLM", "deployment_id": "d"})
    body = engine_registration(
        decide(config, pack=load_pack("turnout")),
        config,
        engine_id=engine_id,
        address=f"10.0.0.{len(engine_id)}:8001",
        engine="turnout",
        vllm_version="0.33.0",
        pack="turnout",
        deployment_id="d",
    )
    return body.model_dump(mode="json")


def _engine_end(c: Ctx, h: dict[str, str]) -> Any:
    engine_id = uuid.uuid4().hex
    admin = {"Authorization": f"Bearer {c.tokens['admin']}"}
    put = c.client.put(f"/api/v1/engines/{engine_id}", headers=admin, json=_registration(engine_id))
    assert put.status_code == 201, put.text
    return c.client.delete(f"/api/v1/engines/{engine_id}", headers=h)


def _health_report() -> dict[str, Any]:
    end = dt.datetime.now(dt.UTC)
    return {
        "report_id": uuid.uuid4().hex,
        "deployment_id": "d",
        "pack": "turnout",
        "runner": "v2",
        "family": "qwen3",
        "stage": "qwen3-canary",
        "window_start": (end - dt.timedelta(minutes=1)).isoformat(),
        "window_end": end.isoformat(),
        "num_requests": 0,
        "num_errors": 0,
    }


def _throwaway_token_id(c: Ctx) -> int:
    r = c.client.post(
        "/api/v1/tokens",
        json={"name": "throwaway", "role": "viewer"},
        headers={"Authorization": f"Bearer {c.tokens['admin']}"},
    )
    return int(r.json()["id"])


# name → (minimum role, success status, call(client, headers) -> response)
Call = Callable[[Ctx, dict[str, str]], Any]


def _patch(c: Ctx, h: dict[str, str]) -> Any:
    cohort, version = _cohort(c)
    return c.client.patch(
        f"/api/v1/canaries/{cohort}",
        headers={**h, "If-Match": str(version)},
        json={"enabled": _toggled(c) == "true", "reason": "auth table"},
    )


def _marked(c: Ctx, send: Callable[[], Any]) -> Any:
    """``send()``, the audit log's length noted just before (the setup is not the call)."""
    c.mark = _audit_len(c)
    return send()


def _admin(c: Ctx) -> dict[str, str]:
    return {"Authorization": f"Bearer {c.tokens['admin']}"}


def _version_of(c: Ctx, cohort: str) -> str:
    return str(c.client.get(f"/api/v1/canaries/{cohort}", headers=_admin(c)).headers["ETag"])


def _live_ramp(c: Ctx, cohort: str, *, paused: bool = False) -> dict[str, Any]:
    """A live ramp of ``cohort`` (made by the admin when there is none; paused when asked)."""
    from turnout.dashboard.store import ramps
    from turnout.dashboard.store.models import utcnow

    live = c.client.get(f"/api/v1/ramps?cohort={cohort}&live=true", headers=_admin(c)).json()
    if not live:
        live = [
            c.client.post(
                f"/api/v1/canaries/{cohort}/ramp",
                json=RAMP_BODY,
                headers={**_admin(c), "If-Match": _version_of(c, cohort)},
            ).json()
        ]
    if paused and live[0]["state"] == "active":
        with c.services.db.write_session() as s:
            canary, ramp = ramps.lock(s, live[0]["id"])
            ramps.fail(session=s, canary=canary, ramp=ramp, now=utcnow(), gates=[], why="t")
            s.commit()
    return dict(c.client.get(f"/api/v1/ramps/{live[0]['id']}", headers=_admin(c)).json())


def _ramp_start(c: Ctx, h: dict[str, str]) -> Any:
    live = c.client.get("/api/v1/ramps?cohort=pooling&live=true", headers=_admin(c)).json()
    for ramp in live:
        c.client.post(
            f"/api/v1/ramps/{ramp['id']}/cancel",
            json={"reason": "setup"},
            headers={**_admin(c), "If-Match": str(ramp["version"])},
        )
    return _marked(
        c,
        lambda: c.client.post(
            "/api/v1/canaries/pooling/ramp",
            json=RAMP_BODY,
            headers={**h, "If-Match": _version_of(c, "pooling")},
        ),
    )


def _ramp_change(what: str, paused: bool) -> Call:
    def call(c: Ctx, h: dict[str, str]) -> Any:
        ramp = _live_ramp(c, "attention-free", paused=paused)
        return _marked(
            c,
            lambda: c.client.post(
                f"/api/v1/ramps/{ramp['id']}/{what}",
                json={"reason": "auth table"},
                headers={**h, "If-Match": str(ramp["version"])},
            ),
        )

    return call


def _soon() -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()


def _schedule(c: Ctx, h: dict[str, str]) -> Any:
    return c.client.post(
        "/api/v1/scheduled-flips",
        headers=h,
        json={"cohort": "pooling", "enabled": False, "run_at": _soon(), "reason": "auth table"},
    )


def _schedule_cancel(c: Ctx, h: dict[str, str]) -> Any:
    flip = _schedule(c, _admin(c)).json()
    return _marked(
        c,
        lambda: c.client.post(
            f"/api/v1/scheduled-flips/{flip['id']}/cancel",
            json={"reason": "auth table"},
            headers={**h, "If-Match": str(flip["version"])},
        ),
    )


def _decision(what: str) -> Call:
    def call(c: Ctx, h: dict[str, str]) -> Any:
        from turnout.dashboard.store import schedule

        with c.services.db.write_session() as s:  # a request by someone else
            flip = schedule.request_flip(
                session=s,
                cohort="quantized",
                enabled=True,
                percentage=None,
                reason="r",
                actor="carol",
                requester="carol",
                run_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
                if_version=None,
                needs_approval=True,
            )
            s.commit()
        return _marked(
            c,
            lambda: c.client.post(
                f"/api/v1/approvals/flip/{flip.id}/{what}", json={"reason": "auth table"}, headers=h
            ),
        )

    return call


def _webhook(c: Ctx, h: dict[str, str]) -> Any:
    return c.client.post(
        "/api/v1/webhooks",
        headers=h,
        json={"url": "https://hooks.example.com/x", "kinds": ["flip"]},
    )


def _webhook_remove(c: Ctx, h: dict[str, str]) -> Any:
    hook = _webhook(c, _admin(c)).json()
    return _marked(
        c,
        lambda: c.client.post(
            f"/api/v1/webhooks/{hook['id']}/remove", json={"reason": "auth table"}, headers=h
        ),
    )


def _retry(c: Ctx, h: dict[str, str]) -> Any:
    from turnout.dashboard.store.models import utcnow
    from turnout.dashboard.store.models_rollout import OutboxEntry

    hook = _webhook(c, _admin(c)).json()
    with c.services.db.write_session() as s:  # a dead delivery of a live subscription
        entry = OutboxEntry(
            webhook_id=hook["id"],
            delivery_id=uuid.uuid4().hex,
            kind="flip",
            payload={},
            state="dead",
            num_attempts=8,
            created_at=utcnow(),
            next_attempt_at=utcnow(),
        )
        s.add(entry)
        s.commit()
    return _marked(c, lambda: c.client.post(f"/api/v1/webhooks/outbox/{entry.id}/retry", headers=h))


RAMP_BODY = {
    "steps": [{"percentage": 10, "bake_s": 60}, {"percentage": 100, "bake_s": 60}],
    "reason": "auth table",
}

API: dict[str, tuple[str, int, Call]] = {
    "POST /canaries/{cohort}/ramp": ("operator", 201, _ramp_start),
    "POST /ramps/{id}/cancel": ("operator", 200, _ramp_change("cancel", paused=False)),
    "POST /ramps/{id}/resume": ("operator", 200, _ramp_change("resume", paused=True)),
    "POST /scheduled-flips": ("operator", 201, _schedule),
    "POST /scheduled-flips/{id}/cancel": ("operator", 200, _schedule_cancel),
    "POST /approvals/{subject}/{id}/approve": ("operator", 200, _decision("approve")),
    "POST /approvals/{subject}/{id}/reject": ("operator", 200, _decision("reject")),
    "POST /webhooks": ("admin", 201, _webhook),
    "POST /webhooks/{id}/remove": ("admin", 200, _webhook_remove),
    "POST /webhooks/outbox/{id}/retry": ("admin", 200, _retry),
    "PATCH /canaries/{cohort}": ("operator", 200, _patch),
    "POST /kill-switch": (
        "operator",
        200,
        lambda c, h: c.client.post(
            "/api/v1/kill-switch",
            headers=h,
            json={"engaged": _kill_toggled(c), "reason": "auth table"},
        ),
    ),
    "PUT /engines/{id}": (
        "engine",
        201,
        lambda c, h: c.client.put(
            f"/api/v1/engines/{(e := uuid.uuid4().hex)}", headers=h, json=_registration(e)
        ),
    ),
    "DELETE /engines/{id}": ("engine", 204, _engine_end),
    "POST /decisions": (
        "engine",
        200,
        lambda c, h: c.client.post("/api/v1/decisions", headers=h, json={"events": [_event()]}),
    ),
    "POST /health": (
        "engine",
        200,
        lambda c, h: c.client.post(
            "/api/v1/health", headers=h, json={"reports": [_health_report()]}
        ),
    ),
    "POST /evidence": (
        "operator",
        201,
        lambda c, h: c.client.post(
            "/api/v1/evidence",
            headers=h,
            json={"family": "qwen3", "suite": "tests/parity", "result": "pass"},
        ),
    ),
    "POST /tokens": (
        "admin",
        201,
        lambda c, h: c.client.post(
            "/api/v1/tokens", headers=h, json={"name": "n", "role": "viewer"}
        ),
    ),
    "POST /tokens/{id}/revoke": (
        "admin",
        200,
        lambda c, h: c.client.post(
            f"/api/v1/tokens/{_throwaway_token_id(c)}/revoke",
            headers=h,
            json={"reason": "auth table"},
        ),
    ),
}


def _headers(c: Ctx, who: str) -> dict[str, str]:
    return {} if who == "none" else {"Authorization": f"Bearer {c.tokens[who]}"}


def _audit_len(c: Ctx) -> int:
    return len(
        c.client.get(
            "/api/v1/audit?limit=1000", headers={"Authorization": f"Bearer {c.tokens['viewer']}"}
        ).json()
    )


@pytest.mark.parametrize("who", IDENTITIES)
@pytest.mark.parametrize("endpoint", sorted(API))
def test_api_mutations(ctx: Ctx, endpoint: str, who: str) -> None:
    needed, ok_status, call = API[endpoint]
    want = 401 if who in ("none", "bad") else ok_status if RANK[who] >= RANK[needed] else 403
    before = _audit_len(ctx)
    ctx.mark = None
    r = call(ctx, _headers(ctx, who))
    before = before if ctx.mark is None else ctx.mark
    assert r.status_code == want, r.text
    if want in (401, 403):
        assert r.json()["detail"]["code"] in (
            ErrorCode.UNAUTHENTICATED,
            ErrorCode.BAD_TOKEN,
            ErrorCode.FORBIDDEN,
        )
        # revoke's setup creates one token (audited) before the refused call
        assert _audit_len(ctx) - before == (1 if "revoke" in endpoint else 0)


def test_api_mutations_ignore_the_page_cookie(ctx: Ctx) -> None:
    cohort, version = _cohort(ctx)
    sign_in(ctx.client, ctx.tokens["admin"])
    try:
        r = ctx.client.patch(
            f"/api/v1/canaries/{cohort}",
            headers={"If-Match": str(version)},
            json={"enabled": True, "reason": "cookie only"},
        )
    finally:
        ctx.client.cookies.clear()
    assert r.status_code == 401


def _page_post(c: Ctx, who: str, path: str, data: dict[str, Any]) -> Any:
    c.client.cookies.clear()
    if who == "bad":  # a session id the store never gave out
        c.client.cookies.set(COOKIE_NAME, "ses_" + "x" * 43)
    elif who != "none":
        data = {**data, "csrf": sign_in(c.client, c.tokens[who])}
    try:
        return c.client.post(path, data=data, follow_redirects=False)
    finally:
        c.client.cookies.clear()


def _page_ramp(c: Ctx) -> tuple[str, dict[str, Any]]:
    for ramp in c.client.get("/api/v1/ramps?cohort=pooling&live=true", headers=_admin(c)).json():
        c.client.post(
            f"/api/v1/ramps/{ramp['id']}/cancel",
            json={"reason": "setup"},
            headers={**_admin(c), "If-Match": str(ramp["version"])},
        )
    return "/canaries/pooling/ramp", {
        "version": _version_of(c, "pooling").strip('"'),
        "steps": "10,100",
        "bake_min": "5",
        "reason": "page auth table",
    }


def _page_ramp_cancel(c: Ctx) -> tuple[str, dict[str, Any]]:
    ramp = _live_ramp(c, "attention-free")
    return f"/ramps/{ramp['id']}/cancel", {"version": ramp["version"], "reason": "page auth"}


def _page_decision(what: str) -> Callable[[Ctx], tuple[str, dict[str, Any]]]:
    def make(c: Ctx) -> tuple[str, dict[str, Any]]:
        from turnout.dashboard.store import schedule

        with c.services.db.write_session() as s:  # a request by someone else
            flip = schedule.request_flip(
                session=s,
                cohort="quantized",
                enabled=True,
                percentage=None,
                reason="r",
                actor="carol",
                requester="carol",
                run_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
                if_version=None,
                needs_approval=True,
            )
            s.commit()
        return f"/approvals/flip/{flip.id}/{what}", {"reason": "page auth table"}

    return make


def _page_schedule_cancel(c: Ctx) -> tuple[str, dict[str, Any]]:
    flip = _schedule(c, _admin(c)).json()
    return f"/scheduled-flips/{flip['id']}/cancel", {
        "version": flip["version"],
        "reason": "page auth",
    }


def _page_webhook_remove(c: Ctx) -> tuple[str, dict[str, Any]]:
    hook = _webhook(c, _admin(c)).json()
    return f"/webhooks/{hook['id']}/remove", {"reason": "page auth"}


def _page_retry(c: Ctx) -> tuple[str, dict[str, Any]]:
    r = _retry(c, {})  # the setup of the API's retry, answered 401: a dead delivery is left
    assert r.status_code == 401
    from turnout.dashboard.store import webhooks

    with c.services.db.read_session() as s:
        return f"/webhooks/outbox/{webhooks.list_outbox(session=s, state='dead')[0].id}/retry", {}


CANARIES, WEBHOOKS = "/canaries?message=", "/webhooks?message="
# name → (minimum role, make(ctx) -> (path, form data), where success redirects; None: the
# answer is a page of its own, 200)
PAGES: dict[str, tuple[str, Callable[[Ctx], tuple[str, dict[str, Any]]], str | None]] = {
    "page flip": (
        "operator",
        lambda c: (
            f"/canaries/{_cohort(c)[0]}",
            {"enabled": _toggled(c), "version": _cohort(c)[1], "reason": "page auth table"},
        ),
        CANARIES,
    ),
    "page kill switch": (
        "operator",
        lambda c: (
            "/kill-switch",
            {"engaged": str(_kill_toggled(c)).lower(), "reason": "page auth"},
        ),
        CANARIES,
    ),
    "page ramp start": ("operator", _page_ramp, CANARIES),
    "page ramp cancel": ("operator", _page_ramp_cancel, CANARIES),
    "page approve": ("operator", _page_decision("approve"), CANARIES),
    "page reject": ("operator", _page_decision("reject"), CANARIES),
    "page schedule": (
        "operator",
        lambda c: (
            "/scheduled-flips",
            {
                "cohort": "pooling",
                "enabled": "false",
                "run_at": _soon()[:16],
                "reason": "page auth",
            },
        ),
        CANARIES,
    ),
    "page schedule cancel": ("operator", _page_schedule_cancel, CANARIES),
    "page webhook add": (
        "admin",
        lambda c: ("/webhooks", {"url": "https://hooks.example.com/p", "kinds": "flip"}),
        None,
    ),
    "page webhook remove": ("admin", _page_webhook_remove, WEBHOOKS),
    "page delivery retry": ("admin", _page_retry, WEBHOOKS),
}


@pytest.mark.parametrize("who", IDENTITIES)
@pytest.mark.parametrize("form", sorted(PAGES))
def test_page_forms(ctx: Ctx, form: str, who: str) -> None:
    needed, make, success = PAGES[form]
    path, data = make(ctx)
    before = _audit_len(ctx)
    r = _page_post(ctx, who, path, data)
    if who in ("none", "bad"):
        assert (r.status_code, r.headers["location"]) == (303, "/login")
    elif RANK[who] < RANK[needed]:
        assert r.status_code == 403
    else:
        if success is None:
            assert r.status_code == 200 and 'id="message"' in r.text, r.text
        else:
            assert r.status_code == 303, r.text
            assert r.headers["location"].startswith(success), r.headers["location"]
        assert _audit_len(ctx) == before + 1
        return
    assert _audit_len(ctx) == before


def test_page_form_without_csrf_is_refused(ctx: Ctx) -> None:
    cohort, version = _cohort(ctx)
    sign_in(ctx.client, ctx.tokens["admin"])
    try:
        r = ctx.client.post(
            f"/canaries/{cohort}",
            follow_redirects=False,
            data={"enabled": "true", "version": version, "reason": "x"},
        )
    finally:
        ctx.client.cookies.clear()
    assert r.status_code == 403


def test_page_flip_with_a_stale_version_changes_nothing_and_says_why(ctx: Ctx) -> None:
    cohort, version = _cohort(ctx)
    before = _audit_len(ctx)
    r = _page_post(
        ctx,
        "operator",
        f"/canaries/{cohort}",
        {"enabled": "true", "version": version - 1 or 999, "reason": "stale"},
    )
    assert r.status_code == 303 and "error=" in r.headers["location"]
    assert "version" in r.headers["location"]
    assert _audit_len(ctx) == before and _cohort(ctx) == (cohort, version)
