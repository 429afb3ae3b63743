"""Hostile input to the JSON API and the pages, on SQLite and PostgreSQL: bodies that are not
UTF-8 or too large, NUL characters and non-finite numbers the database cannot store, odd
If-Match values, repeated event ids, HTML in what a page echoes. Never a 5xx; each is refused
with a 4xx that says why, or stored as documented."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import HTTPException
from service_helpers import Api, ack, api_events

from turnout.dashboard.api.rollout import parse_if_match
from turnout.dashboard.deps import MAX_BODY
from turnout.oracle.errors import ErrorCode

NOT_UTF8 = b'{"config": {"architecture": "\xff\xfe"}}'


@pytest.mark.parametrize(
    "path, role",
    [
        ("/api/v1/decide", "viewer"),
        ("/api/v1/explain", "viewer"),
        ("/api/v1/decisions", "operator"),
    ],
)
def test_body_that_is_not_utf8_is_a_422_without_echo(api: Api, path: str, role: str) -> None:
    r = api.client.post(path, content=NOT_UTF8 * 50, headers=api.h(role))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["code"] == ErrorCode.INVALID_REQUEST
    assert detail["message"].startswith("the body: not valid JSON"), detail["message"]
    (err,) = detail["errors"]
    assert err["type"] == "json_invalid" and "input" not in err


def _flip_url(api: Api) -> tuple[str, dict[str, str]]:
    url = "/api/v1/canaries/qwen3-canary"
    etag = api.client.get(url, headers=api.h("viewer")).headers["ETag"]
    return url, {**api.h("operator"), "If-Match": etag}


@pytest.mark.parametrize(
    "request_args, message",
    [
        ({"json": {"enabled": True}}, "body field reason: Field required"),
        (
            {"content": b"enabled=true", "headers": {"Content-Type": "application/json"}},
            "the body: not valid JSON",
        ),
        (
            {"json": {"enabled": "yes", "reason": "r", "percentage": 101}},
            "body field enabled: Input should be a valid boolean; body field percentage: Input "
            "should be less than or equal to 100",
        ),
    ],
)
def test_an_invalid_request_gets_the_api_error_shape_naming_each_field(
    api: Api, request_args: dict[str, Any], message: str
) -> None:
    url, headers = _flip_url(api)
    args = dict(request_args)  # shared by both backends' runs
    headers.update(args.pop("headers", {}))
    r = api.client.patch(url, headers=headers, **args)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["code"] == ErrorCode.INVALID_REQUEST
    assert detail["message"].startswith(message), detail["message"]
    assert detail["errors"] and all("loc" in e and "msg" in e for e in detail["errors"])
    assert api.client.get(url, headers=api.h("viewer")).json()["version"] == 1


def test_invalid_query_parameters_and_evidence_bodies_name_the_field(api: Api) -> None:
    r = api.client.get("/api/v1/audit", params={"limit": "0"}, headers=api.h("viewer"))
    assert r.status_code == 422
    assert r.json()["detail"]["message"] == (
        "query parameter limit: Input should be greater than or equal to 1"
    )
    r = api.client.post("/api/v1/evidence", json={"family": "llama"}, headers=api.h("operator"))
    assert r.status_code == 422 and r.json()["detail"]["code"] == ErrorCode.INVALID_REQUEST
    assert "body field suite: Field required" in r.json()["detail"]["message"]


def test_the_openapi_document_describes_the_422_it_answers(api: Api) -> None:
    doc = api.client.get("/api/v1/openapi.json").json()
    invalid = doc["components"]["schemas"]["HTTPValidationError"]
    body = doc["components"]["schemas"][invalid["properties"]["detail"]["$ref"].split("/")[-1]]
    assert set(body["required"]) == {"code", "message", "errors"}


def test_bodies_are_bounded(api: Api) -> None:
    big = json.dumps(
        {"config": {"architecture": "LlamaForCausalLM", "model": "m" * MAX_BODY}}
    ).encode()
    for path in ("/api/v1/decide", "/api/v1/explain"):
        r = api.client.post(path, content=big, headers=api.h("viewer"))
        assert r.status_code == 413, path
    r = api.client.patch(
        "/api/v1/canaries/x", content=big, headers={**api.h("operator"), "If-Match": "1"}
    )
    assert r.status_code == 413
    r = api.client.post(
        "/login",
        content=b"token=" + b"t" * (2 * MAX_BODY),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 413
    # A large ingest batch is still taken: 5,000 events of a real size are several megabytes.
    batch = api_events(5000, config={"architecture": "Qwen3ForCausalLM", "model": "q" * 400})
    body = json.dumps({"events": batch}).encode()
    assert len(body) > 2 * MAX_BODY
    r = api.client.post("/api/v1/decisions", content=body, headers=api.h("operator"))
    assert r.json() == ack(batch, 5000)


@pytest.mark.parametrize(
    "event",
    [
        {"deployment_id": "nul\x00dep"},
        {"host": "h\x00"},
        {"policy_digest": "d\x00"},
        {"rule_ids": ["r\x00"]},
        {"deployment_id": "esc\x1b[31mdep"},
        {"deployment_id": "   "},  # before: stored, a row no one can read or filter by
        {"deployment_id": "\u200b\u2060"},
        {"family": "llama\x07"},
        {"rule_ids": ["r" * 129]},
        {"config": {"model": "\x00"}},
    ],
)
def test_nul_characters_in_an_event_never_give_a_5xx(api: Api, event: dict[str, object]) -> None:
    batch = api_events(2, **event)
    r = api.client.post("/api/v1/decisions", json={"events": batch}, headers=api.h("operator"))
    # Before: SQLite stored these (a NUL then went raw into the CSV export, a rule id over
    # 128 characters into a 128-character column) and PostgreSQL refused them. Now the API
    # refuses them on every backend, naming the field, and stores nothing.
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["code"] == ErrorCode.INVALID_REQUEST
    if "config" in event:
        assert "nul_character" in r.text and "U+0000" in r.text
    else:
        assert next(iter(event)) in r.json()["detail"]["message"]
    fb = api.client.get("/api/v1/fallbacks", headers=api.h("viewer")).json()
    assert fb["num_deployments"] == 0
    good = api.client.post(
        "/api/v1/decisions",
        json={"events": api_events(1, deployment_id="ok")},
        headers=api.h("operator"),
    )
    assert good.json()["inserted"] == 1  # the connection and the service carry on


def test_infinity_in_an_event_config_never_gives_a_5xx(api: Api) -> None:
    # Not JSON: refused on both backends alike (SQLite stored it, PostgreSQL refused it).
    body = json.dumps({"events": api_events(1, config={"cpu_offload_gb": float("inf")})})
    r = api.client.post("/api/v1/decisions", content=body.encode(), headers=api.h("operator"))
    assert r.status_code == 422, r.text
    assert "Infinity is not a JSON number" in r.json()["detail"]["message"]


@pytest.mark.parametrize(
    "params", [{"family": "a\x00"}, {"deployment_id": "\x00"}, {"rule_id": "x\x00:y"}]
)
def test_nul_in_filters_never_gives_a_5xx(api: Api, params: dict[str, str]) -> None:
    r = api.client.get("/api/v1/decisions", params=params, headers=api.h("viewer"))
    assert r.status_code in (200, 422), r.text
    r = api.client.get("/api/v1/audit", params={"target": "a\x00"}, headers=api.h("viewer"))
    assert r.status_code in (200, 422), r.text


def test_nul_in_writes_never_gives_a_5xx(api: Api) -> None:
    cohort = api.client.get("/api/v1/canaries", headers=api.h("viewer")).json()["cohorts"][0]
    r = api.client.patch(
        f"/api/v1/canaries/{cohort['cohort']}",
        headers={**api.h("operator"), "If-Match": str(cohort["version"])},
        json={"enabled": not cohort["enabled"], "reason": "because\x00"},
    )
    assert r.status_code in (200, 422), r.text
    after = api.client.get(
        "/api/v1/audit", params={"target": f"cohort:{cohort['cohort']}"}, headers=api.h("viewer")
    ).json()
    assert len(after) == (1 if r.status_code == 200 else 0)  # nothing half-written
    r = api.client.get("/api/v1/canaries/a%00b", headers=api.h("viewer"))
    assert r.status_code in (404, 422), r.text
    r = api.client.post(
        "/api/v1/tokens", json={"name": "n\x00", "role": "viewer"}, headers=api.h("admin")
    )
    assert r.status_code in (201, 422), r.text
    r = api.client.post(
        "/api/v1/evidence",
        json={"family": "qwen3", "suite": "s\x00", "result": "pass"},
        headers=api.h("operator"),
    )
    assert r.status_code in (201, 422), r.text


@pytest.mark.parametrize("num_digits", [40, 5000])
def test_a_huge_if_match_version_is_a_conflict(api: Api, num_digits: int) -> None:
    # 5000 digits: more than int() converts from a string (a 500 before).
    cohort = api.client.get("/api/v1/canaries", headers=api.h("viewer")).json()["cohorts"][0]
    r = api.client.patch(
        f"/api/v1/canaries/{cohort['cohort']}",
        headers={**api.h("operator"), "If-Match": "9" * num_digits},
        json={"enabled": True, "reason": "odd version"},
    )
    assert r.status_code == 409, r.text
    assert r.headers["ETag"] == f'"{cohort["version"]}"'


@pytest.mark.parametrize(
    "body",
    [
        {"enabled": True, "percentage": True},  # was taken as 1%
        {"enabled": True, "percentage": "50"},
        {"enabled": True, "percentage": 50.0},
        {"enabled": "yes"},
        {"enabled": 1},
    ],
)
def test_a_flip_of_the_wrong_json_type_is_refused_and_changes_nothing(
    api: Api, body: dict[str, object]
) -> None:
    url = (
        "/api/v1/canaries/"
        + api.client.get("/api/v1/canaries", headers=api.h("viewer")).json()["cohorts"][1]["cohort"]
    )
    before = api.client.get(url, headers=api.h("viewer")).json()
    r = api.client.patch(
        url,
        json={**body, "reason": "typed"},
        headers={**api.h("operator"), "If-Match": str(before["version"])},
    )
    assert r.status_code == 422, r.text
    assert api.client.get(url, headers=api.h("viewer")).json() == before
    r = api.client.post(
        "/api/v1/kill-switch", json={"engaged": "true", "reason": "typed"}, headers=api.h("admin")
    )
    assert r.status_code == 422, r.text
    audit = api.client.get("/api/v1/audit", headers=api.h("viewer")).json()
    assert [a for a in audit if a["action"] != "token.create"] == []


@pytest.mark.parametrize("value", ["\xb2", 'W/"\xb2"', "\u0661", "+1", " "])
def test_if_match_takes_ascii_digits_only(value: str) -> None:
    # Header values arrive decoded as latin-1: b"\xb2" is "²", which str.isdigit() accepts
    # and int() refuses (a 500 before).
    with pytest.raises(HTTPException) as info:
        parse_if_match(value)
    assert info.value.status_code == 400
    assert parse_if_match('W/"12"') == 12


def test_an_event_repeated_in_a_batch_keeps_its_first_copy(api: Api) -> None:
    first, again = api_events(2)
    again.update(
        event_id=first["event_id"], runner="v2", reason_code="TARGETING_MATCH", rule_ids=[]
    )
    r = api.client.post(
        "/api/v1/decisions", json={"events": [first, again]}, headers=api.h("operator")
    )
    assert r.json() == ack([first, again], 1)
    (row,) = api.client.get(
        f"/api/v1/decisions?deployment_id={first['deployment_id']}", headers=api.h("viewer")
    ).json()
    assert row["runner"] == "v1"  # as a resend in a later batch would leave it


def test_confirm_fragment_escapes_the_cohort_it_echoes(api: Api) -> None:
    api.sign_in("operator")
    r = api.client.get("/canaries/%3Cscript%3Ealert(1)/confirm?enabled=true")
    api.client.cookies.clear()
    assert r.status_code == 404
    assert "<script>" not in r.text and "&lt;script&gt;alert(1)" in r.text


def test_an_unknown_query_parameter_is_refused_naming_it(api: Api) -> None:
    api.client.post("/api/v1/decisions", json={"events": api_events(2)}, headers=api.h("operator"))
    r = api.client.get("/api/v1/decisions", params={"deployment": "d0"}, headers=api.h("viewer"))
    assert r.status_code == 422, r.text
    message = r.json()["detail"]["message"]
    assert message.startswith(
        "query parameter deployment: not a parameter of this route "
        "(did you mean deployment_id?); it takes deployment_id, "
    ), message
    r = api.client.get("/api/v1/decisions", params={"deployment_id": "d0"}, headers=api.h("viewer"))
    assert [e["deployment_id"] for e in r.json()] == ["d0"]
    for path in (
        "/api/v1/fallbacks",
        "/api/v1/audit",
        "/api/v1/evidence",
        "/api/v1/canaries",
        "/api/v1/matrix",
    ):
        r = api.client.get(path, params={"family": "llama", "nope": "1"}, headers=api.h("viewer"))
        assert r.status_code == 422, path
        assert "query parameter nope" in r.json()["detail"]["message"], path
    # The plain decide route takes no query and is left as it is.
    r = api.client.post(
        "/api/v1/decide?x=1", json={"command": "vllm serve Qwen/Qwen3-8B"}, headers=api.h("viewer")
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "family, message",
    [
        ("Llama", "unknown family 'Llama' (did you mean 'llama'?)"),
        ("qwen3-canary", "'qwen3-canary' is a cohort id, not a family: its families are qwen3"),
        ("zzzzzz", "unknown family 'zzzzzz'; the pack's families: afmoe, alice_ai, arctic, "),
    ],
)
def test_evidence_for_a_name_that_is_not_a_family_is_refused(
    api: Api, family: str, message: str
) -> None:
    r = api.client.post(
        "/api/v1/evidence",
        headers=api.h("operator"),
        json={"family": family, "suite": "tests/parity", "result": "pass"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["code"] == ErrorCode.UNKNOWN_FAMILY
    assert r.json()["detail"]["message"].startswith(message), r.json()["detail"]["message"]
    assert api.client.get("/api/v1/evidence", headers=api.h("viewer")).json() == []


def test_the_canaries_page_shows_only_status_lines_it_signed(api: Api) -> None:
    csrf = api.sign_in("operator")
    try:
        forged = api.client.get("/canaries", params={"message": "Call +1 555 0100 now"})
        assert forged.status_code == 200 and "555 0100" not in forged.text
        version = api.client.get("/api/v1/canaries/qwen3-canary", headers=api.h("viewer")).json()[
            "version"
        ]
        r = api.client.post(
            "/canaries/qwen3-canary",
            follow_redirects=False,
            data={
                "enabled": "false",
                "version": str(version),
                "reason": "p99 regression",
                "csrf": csrf,
            },
        )
        assert r.status_code == 303, r.text
        page = api.client.get(r.headers["location"]).text
        assert 'id="message">qwen3-canary disabled: p99 regression</p>' in page
        # The same link under another session shows nothing.
        api.sign_in("admin")
        assert "p99 regression" not in api.client.get(r.headers["location"]).text
    finally:
        api.client.cookies.clear()


@pytest.mark.parametrize("name", ["\x1f", "\x1c\x1d", " \x1e ", "\u200b", "\u200b\u2060\ufeff"])
def test_a_token_name_python_reads_as_blank_is_a_422(api: Api, name: str) -> None:
    # The schema's pattern (\S) lets these through; str.strip() takes them for whitespace,
    # and zero-width characters are no visible name either (before: accepted).
    r = api.client.post(
        "/api/v1/tokens", json={"name": name, "role": "viewer"}, headers=api.h("admin")
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["code"] == ErrorCode.NAME_REQUIRED
    assert all(
        t["name"] != name.strip()
        for t in api.client.get("/api/v1/tokens", headers=api.h("admin")).json()
    )


def test_a_token_name_with_a_control_character_is_a_422(api: Api) -> None:
    # Before: stored, and printed raw (a terminal escape) by `turnout audit` and `tokens list`.
    for name in ("ci\x1b[2Jbot", "ci\x00", "tab\tbed"):
        r = api.client.post(
            "/api/v1/tokens", json={"name": name, "role": "viewer"}, headers=api.h("admin")
        )
        assert r.status_code == 422 and "control character" in r.text, r.text
    names = [t["name"] for t in api.client.get("/api/v1/tokens", headers=api.h("admin")).json()]
    assert not any("\x1b" in n or "\x00" in n or "\t" in n for n in names)


_DEEP = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize(
    "path, role, body",
    [
        # NaN and Infinity in a body that fails validation: the 422 echoed them, and NaN is no JSON
        ("/api/v1/decide", "viewer", b"NaN"),
        ("/api/v1/decide", "viewer", b'{"command": NaN}'),
        ("/api/v1/explain", "viewer", b'{"argv": [Infinity]}'),
        ("/api/v1/decisions", "operator", b'{"events": [{"event_id": NaN}]}'),
        # model ids no file system takes, and JSON values nested beyond Python's recursion limit
        ("/api/v1/decide", "viewer", json.dumps({"command": "vllm serve " + "A" * 300}).encode()),
        ("/api/v1/decide", "viewer", json.dumps({"command": "vllm serve ~nosuchuser/x"}).encode()),
        (
            "/api/v1/decide",
            "viewer",
            json.dumps(
                {"argv": ["vllm", "serve", "Qwen/Qwen3-8B", "--speculative-config", _DEEP]}
            ).encode(),
        ),
        # argparse's time grows with the square of a line's length
        (
            "/api/v1/decide",
            "viewer",
            json.dumps({"command": "vllm serve Qwen/Qwen3-8B " + "-O3 " * 5000}).encode(),
        ),
    ],
)
def test_hostile_bodies_get_a_4xx_never_a_5xx(api: Api, path: str, role: str, body: bytes) -> None:
    r = api.client.post(
        path, content=body, headers={**api.h(role), "Content-Type": "application/json"}
    )
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["detail"]["code"], r.text
