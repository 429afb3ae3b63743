"""Every bad body, on every JSON route, gets the API's error shape with a 4xx, whatever its
bytes: NaN, Infinity, lone surrogates, bytes that are not UTF-8, bodies too large, of another
media type, empty, nested too deeply, numbers too large; and what an error echoes of the
request is bounded. (Parsing does not depend on the database: SQLite only here.)"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_helpers import Api, api_events, role_tokens

from turnout.dashboard.app import create_app
from turnout.dashboard.deps import MAX_BODY, MAX_INGEST_BODY
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.oracle.errors import ErrorCode

SLOT = "@@"  # where a route's body template takes the hostile value


@pytest.fixture(scope="module")
def sq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    path: Path = tmp_path_factory.mktemp("hostile") / "h.db"
    services = Services.build(
        Settings(database_url=f"sqlite:///{path}", demo=False, snapshot_ttl_s=0)
    )
    with TestClient(create_app(services=services), raise_server_exceptions=False) as client:
        yield Api(client, services, role_tokens(services.db))


def _event_template() -> str:
    event = api_events(1)[0]
    event["at"] = SLOT
    return json.dumps({"events": [event]}).replace(f'"{SLOT}"', SLOT)


def _health_template() -> str:
    end = dt.datetime.now(dt.UTC)
    report = {
        "report_id": "r1",
        "deployment_id": "d",
        "pack": "turnout",
        "runner": "v2",
        "family": "qwen3",
        "stage": "qwen3-canary",
        "window_start": SLOT,
        "window_end": end.isoformat(),
        "num_requests": 0,
        "num_errors": 0,
    }
    return json.dumps({"reports": [report]}).replace(f'"{SLOT}"', SLOT)


# (method, path, role, body with SLOT where the value goes): every route that takes JSON.
ROUTES: dict[str, tuple[str, str, str, str]] = {
    "canary percentage": (
        "PATCH",
        "/api/v1/canaries/qwen3-canary",
        "operator",
        '{"enabled": true, "percentage": @@, "reason": "r"}',
    ),
    "canary reason": (
        "PATCH",
        "/api/v1/canaries/qwen3-canary",
        "operator",
        '{"enabled": true, "reason": @@}',
    ),
    "decisions at": ("POST", "/api/v1/decisions", "operator", _event_template()),
    "health window_start": ("POST", "/api/v1/health", "operator", _health_template()),
    "decide argv": ("POST", "/api/v1/decide", "viewer", '{"argv": @@}'),
    "decide command": ("POST", "/api/v1/decide", "viewer", '{"command": @@}'),
    "explain config": ("POST", "/api/v1/explain", "viewer", '{"config": {"architecture": @@}}'),
    "kill-switch reason": (
        "POST",
        "/api/v1/kill-switch",
        "admin",
        '{"engaged": false, "reason": @@}',
    ),
    "evidence family": (
        "POST",
        "/api/v1/evidence",
        "operator",
        '{"family": @@, "suite": "s", "result": "pass"}',
    ),
    "token name": ("POST", "/api/v1/tokens", "admin", '{"name": @@, "role": "viewer"}'),
    "revoke reason": ("POST", "/api/v1/tokens/1/revoke", "admin", '{"reason": @@}'),
}
# value (as JSON text, or raw bytes) → what the message says about it
VALUES: dict[str, tuple[bytes, str]] = {
    "NaN": (b"NaN", "NaN is not a JSON number at line 1 column "),
    "Infinity": (b"Infinity", "Infinity is not a JSON number at line 1 column "),
    "-Infinity": (b"-Infinity", "-Infinity is not a JSON number at line 1 column "),
    "lone surrogate escape": (
        b'"\\ud800"',
        "a lone surrogate escape (such as \\ud800) is not a character at line 1 column ",
    ),
    "lone low surrogate": (b'"x\\udc00"', "a lone surrogate escape"),
    "surrogate bytes": ('"\ud800"'.encode("utf-8", "surrogatepass"), "not UTF-8: byte 0xed"),
    "latin-1 byte": (b'"caf\xe9"', "not UTF-8: byte 0xe9 at offset "),
    "nesting": (b"[" * 300 + b"]" * 300, "nested deeper than 200 levels at line 1 column "),
    "5000 digits": (b"1" + b"0" * 5000, "a number too large to read at line 1 column "),
}


def _call(api: Api, route: str, body: bytes, **headers: str) -> Any:
    method, path, role, _template = ROUTES[route]
    extra = {"If-Match": "1"} if method == "PATCH" else {}
    return api.client.request(
        method, path, content=body, headers={**api.h(role), **extra, **headers}
    )


def _body(route: str, value: bytes) -> bytes:
    before, after = ROUTES[route][3].split(SLOT)
    return before.encode() + value + after.encode()


def _detail(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.headers
    detail: dict[str, Any] = r.json()["detail"]
    assert detail["code"] == code, detail
    return detail


@pytest.mark.parametrize("value", sorted(VALUES))
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_what_is_not_json_is_a_422_that_says_what_and_where(
    sq: Api, route: str, value: str
) -> None:
    # Before: a lone surrogate in a reason or a family was a 500 (it reached the database or
    # the 422's echo, neither of which can encode it), bytes that are not UTF-8, deep nesting
    # and huge numbers a 400 {"detail": "There was an error parsing the body"}, NaN a 422
    # about the field's type.
    raw, says = VALUES[value]
    r = _call(sq, route, _body(route, raw), **{"Content-Type": "application/json"})
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["message"].startswith("the body: not valid JSON ("), detail["message"]
    assert says in detail["message"], detail["message"]
    (err,) = detail["errors"]
    assert err["type"] == "json_invalid" and err.get("input", {}) == {}  # the body not echoed


def test_nothing_is_stored_from_a_body_that_is_not_json(sq: Api) -> None:
    for route in ("kill-switch reason", "canary reason", "evidence family"):
        _call(sq, route, _body(route, b'"\\ud800"'))
    audit = sq.client.get("/api/v1/audit", headers=sq.h("viewer")).json()
    assert [a["action"] for a in audit if a["action"] != "token.create"] == []
    assert sq.client.get("/api/v1/evidence", headers=sq.h("viewer")).json() == []


def test_a_huge_exponent_is_refused_by_the_field_it_is_in(sq: Api) -> None:
    r = _call(sq, "canary percentage", _body("canary percentage", b"1e400"))
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["message"] == "body field percentage: Input should be a valid integer"
    assert detail["errors"][0]["input"] == "inf"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
    ],
)
@pytest.mark.parametrize(
    "route",
    [
        "canary reason",
        "kill-switch reason",
        "decide command",
        "decisions at",
        "health window_start",
        "token name",
    ],
)
def test_a_body_of_another_media_type_is_a_415(sq: Api, route: str, content_type: str) -> None:
    # Before: a 422 "the body: Input should be a valid dictionary or object to extract
    # fields from" (FastAPI left the body unread), or it was read as JSON whatever it was.
    r = _call(sq, route, _body(route, b'"ok"'), **{"Content-Type": content_type})
    detail = _detail(r, 415, ErrorCode.UNSUPPORTED_MEDIA_TYPE)
    assert detail["message"] == (
        f"send the body as JSON (Content-Type: application/json), not {content_type!r}"
    )


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "application/merge-patch+json", None]
)
def test_json_media_types_and_none_are_read_as_json(sq: Api, content_type: str | None) -> None:
    url = "/api/v1/canaries/qwen3-canary"
    version = sq.client.get(url, headers=sq.h("viewer")).json()["version"]
    headers = {**sq.h("operator"), "If-Match": str(version)}
    if content_type is not None:
        headers["Content-Type"] = content_type
    r = sq.client.patch(url, content=b'{"enabled": true, "reason": "typed"}', headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_an_empty_body_names_the_body(sq: Api, route: str) -> None:
    r = _call(sq, route, b"", **{"Content-Type": "application/json"})
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["message"].startswith("the body: "), detail["message"]


@pytest.mark.parametrize(
    "path, role, limit",
    [
        ("/api/v1/kill-switch", "admin", MAX_BODY),
        ("/api/v1/evidence", "operator", MAX_BODY),
        ("/api/v1/decide", "viewer", MAX_BODY),
        ("/api/v1/explain", "viewer", MAX_BODY),
        ("/api/v1/decisions", "operator", MAX_INGEST_BODY),
        ("/login", "viewer", MAX_BODY),
        ("/api/v1/health", "operator", MAX_INGEST_BODY),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
def test_a_body_too_large_is_a_413_in_the_error_shape(
    sq: Api, path: str, role: str, limit: int, streamed: bool
) -> None:
    # Before: the routers' bound answered a plain text "Content Too Large".
    size = limit + 1

    def chunks() -> Iterator[bytes]:
        for start in range(0, size, 1 << 20):
            yield b"x" * min(1 << 20, size - start)

    media = "application/x-www-form-urlencoded" if path == "/login" else "application/json"
    r = sq.client.post(
        path,
        content=chunks() if streamed else b"x" * size,
        headers={**sq.h(role), "Content-Type": media},
    )
    detail = _detail(r, 413, ErrorCode.BODY_TOO_LARGE)
    assert detail["message"] == f"the body exceeds {limit} bytes"
    assert r.headers["x-content-type-options"] == "nosniff"


def test_errors_echo_a_long_name_bounded(sq: Api) -> None:
    # Before: an unknown 60,000-character cohort came back whole in the 404's message.
    name = "x" * 60_000
    for r in (
        sq.client.get(f"/api/v1/canaries/{name}", headers=sq.h("viewer")),
        sq.client.patch(
            f"/api/v1/canaries/{name}",
            json={"enabled": True, "reason": "r"},
            headers={**sq.h("operator"), "If-Match": "1"},
        ),
    ):
        detail = _detail(r, 404, ErrorCode.UNKNOWN_COHORT)
        assert detail["message"].startswith("unknown cohort 'xxxx")
        assert "… (59800 more characters)" in detail["message"]
        assert len(r.content) < 1_500
    r = sq.client.get(
        "/api/v1/impact", params={"cohort": name, "enabled": "true"}, headers=sq.h("viewer")
    )
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["errors"][0]["input"].endswith("… (59800 more characters)")
    assert len(r.content) < 1_500


def test_errors_echo_long_inputs_and_long_lists_bounded(sq: Api) -> None:
    # Before: the 422 echoed the field's whole input: 30,000 characters of a command, all
    # 5,001 events of a batch over the bound (megabytes).
    r = sq.client.post(
        "/api/v1/decide", json={"command": "vllm serve " + "A" * 30_000}, headers=sq.h("viewer")
    )
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["message"].startswith("body field command: String should have at most")
    assert len(r.content) < 2_000
    batch = api_events(5_001, config={"model": "m" * 100})
    r = sq.client.post("/api/v1/decisions", json={"events": batch}, headers=sq.h("operator"))
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["message"].startswith("body field events: List should have at most 5000")
    assert detail["errors"][0]["input"][-1] == "… 4991 more items"
    assert len(r.content) < 10_000


def test_a_batch_with_many_bad_events_lists_a_few(sq: Api) -> None:
    batch = api_events(1_000, runner="v3")
    r = sq.client.post("/api/v1/decisions", json={"events": batch}, headers=sq.h("operator"))
    detail = _detail(r, 422, ErrorCode.INVALID_REQUEST)
    assert detail["message"].startswith("body field events[0].runner: Input should be ")
    assert detail["message"].endswith("; and 995 more")
    assert len(detail["errors"]) == 20 and len(r.content) < 10_000


@pytest.mark.parametrize(
    "method, path, status, code",
    [
        ("GET", "/api/v1/nope", 404, ErrorCode.NOT_FOUND),
        ("GET", "/static/nope.js", 404, ErrorCode.NOT_FOUND),
        ("DELETE", "/api/v1/canaries", 405, ErrorCode.METHOD_NOT_ALLOWED),
        ("PUT", "/api/v1/decide", 405, ErrorCode.METHOD_NOT_ALLOWED),
    ],
)
def test_starlettes_own_errors_get_the_shape(
    sq: Api, method: str, path: str, status: int, code: str
) -> None:
    # Before: {"detail": "Not Found"}, {"detail": "Method Not Allowed"}.
    r = sq.client.request(method, path, headers=sq.h("viewer"))
    detail = _detail(r, status, code)
    assert detail["message"] in ("Not Found", "Method Not Allowed")


def test_an_unexpected_exception_is_a_500_in_the_shape_with_the_headers(tmp_path: Path) -> None:
    services = Services.build(Settings(database_url=f"sqlite:///{tmp_path / 'e.db'}", demo=False))
    app = create_app(services=services)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret detail of the failure")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    detail = _detail(r, 500, ErrorCode.INTERNAL_ERROR)
    assert "secret" not in r.text and detail["message"].endswith("its log says why")
    assert r.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("route", ["/api/v1/decisions", "/api/v1/health"])
def test_a_client_that_leaves_mid_body_is_no_failure(
    sq: Api, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The ASGI app as uvicorn drives it: part of a body, then the client is gone (an engine
    stopped mid-report). Nothing is answered, nothing is stored, no error is logged (it was
    a 500 and a traceback: ClientDisconnect)."""
    app = sq.client.app
    token = sq.tokens["operator"].encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": route, "raw_path": route.encode(), "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "headers": [(b"host", b"127.0.0.1:8000"), (b"authorization", b"Bearer " + token),
                    (b"content-type", b"application/json"), (b"content-length", b"1000")],
        "state": {},
    }  # fmt: skip
    messages = iter(
        [{"type": "http.request", "body": b'{"events": [', "more_body": True},
         {"type": "http.disconnect"}]
    )  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    before = sq.client.get("/api/v1/decisions?limit=1000", headers=sq.h("viewer")).json()
    with caplog.at_level("INFO", logger="turnout"):
        asyncio.run(app(scope, receive, send))
    assert sent == []
    assert [r.levelname for r in caplog.records if "left before its body" in r.message] == ["INFO"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    after = sq.client.get("/api/v1/decisions?limit=1000", headers=sq.h("viewer")).json()
    assert after == before
