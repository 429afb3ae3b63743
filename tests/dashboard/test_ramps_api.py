"""The closed-loop routes in-process (FastAPI TestClient) on SQLite and PostgreSQL: ramps with
If-Match, scheduled flips, approvals by a second operator, the kill switch's reach, webhook
subscriptions and their outbox, parity evidence with test counts."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from service_helpers import Api, role_tokens

from turnout.oracle.errors import ErrorCode

COHORT = "llama-mistral-dense"  # off by default
RAMP = {
    "steps": [
        {"percentage": 10, "bake_s": 600},
        {"percentage": 50, "bake_s": 600},
        {"percentage": 100, "bake_s": 600},
    ],
    "reason": "parity green on H200",
}


def _api(db_url: str, **settings: Any) -> Iterator[Api]:
    from fastapi.testclient import TestClient

    from turnout.dashboard.app import create_app
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings
    from turnout.dashboard.store import tokens

    services = Services.build(
        Settings(database_url=db_url, demo=False, snapshot_ttl_s=0, background=False, **settings)
    )
    with TestClient(create_app(services=services)) as client:
        made = role_tokens(services.db)
        with services.db.write_session() as s:  # a second operator, for approvals
            _row, made["operator2"] = tokens.create_token(
                session=s, name="bob", role=tokens.Role.operator, actor="t"
            )
            s.commit()
        yield Api(client, services, made)


@pytest.fixture
def rapi(db_url: str) -> Iterator[Api]:
    yield from _api(db_url, ramp_gates={"min_engines": 3})


@pytest.fixture
def approving(db_url: str) -> Iterator[Api]:
    yield from _api(db_url, require_approval=True)


def _version(api: Api, cohort: str = COHORT) -> str:
    return str(
        api.client.get(f"/api/v1/canaries/{cohort}", headers=api.h("viewer")).headers["ETag"]
    )


def _start(api: Api, body: dict[str, Any] | None = None, who: str = "operator") -> Any:
    return api.client.post(
        f"/api/v1/canaries/{COHORT}/ramp",
        json=body or RAMP,
        headers={**api.h(who), "If-Match": _version(api)},
    )


def _audit(api: Api) -> list[tuple[str, str]]:
    return [
        (e["action"], e["reason"])
        for e in api.client.get("/api/v1/audit", headers=api.h("viewer")).json()
        if e["action"] != "token.create"
    ]


def test_a_ramp_needs_if_match_and_starts_at_its_first_step(rapi: Api) -> None:
    url = f"/api/v1/canaries/{COHORT}/ramp"
    assert rapi.client.post(url, json=RAMP, headers=rapi.h("operator")).status_code == 428
    stale = rapi.client.post(url, json=RAMP, headers={**rapi.h("operator"), "If-Match": "9"})
    assert stale.status_code == 409 and stale.json()["detail"]["code"] == "version_conflict"
    r = _start(rapi)
    assert r.status_code == 201, r.text
    ramp = r.json()
    assert (ramp["state"], ramp["percentage"], ramp["version"]) == ("active", 10, 2)
    assert r.headers["ETag"] == '"2"'
    assert ramp["gates"]["min_engines"] == 3  # the service's default
    cohort = rapi.client.get(f"/api/v1/canaries/{COHORT}", headers=rapi.h("viewer")).json()
    assert (cohort["enabled"], cohort["percentage"]) == (True, 10)
    again = _start(rapi)
    assert again.status_code == 409 and again.json()["detail"]["code"] == "ramp_exists"
    listed = rapi.client.get("/api/v1/ramps?live=true", headers=rapi.h("viewer")).json()
    assert [x["id"] for x in listed] == [ramp["id"]]


def test_gates_a_ramp_names_override_only_those_fields(rapi: Api) -> None:
    r = _start(rapi, {**RAMP, "gates": {"max_crash_rate": 0.2}, "on_failure": "rollback"})
    gates = r.json()["gates"]
    assert (gates["min_engines"], gates["max_crash_rate"]) == (3, 0.2)
    assert r.json()["on_failure"] == "rollback"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({**RAMP, "steps": []}, ErrorCode.INVALID_REQUEST),
        (
            {**RAMP, "steps": [{"percentage": 50, "bake_s": 1}, {"percentage": 20, "bake_s": 1}]},
            ErrorCode.BAD_PERCENTAGE,
        ),
        ({**RAMP, "steps": [{"percentage": True, "bake_s": 1}]}, ErrorCode.INVALID_REQUEST),
        ({**RAMP, "gates": {"min_engines": 0}}, ErrorCode.INVALID_REQUEST),
        ({**RAMP, "on_failure": "explode"}, ErrorCode.INVALID_REQUEST),
        ({**RAMP, "reason": " "}, ErrorCode.INVALID_REQUEST),
    ],
)
def test_a_bad_ramp_is_a_422_that_changes_nothing(
    rapi: Api, body: dict[str, Any], code: str
) -> None:
    r = _start(rapi, body)
    assert r.status_code == 422 and r.json()["detail"]["code"] == code, r.text
    assert _audit(rapi) == []


def test_unknown_cohort_ramp_and_flip_ids_are_404s(rapi: Api) -> None:
    r = rapi.client.post(
        "/api/v1/canaries/qwen3/ramp", json=RAMP, headers={**rapi.h("operator"), "If-Match": "1"}
    )
    assert r.status_code == 404 and "qwen3-canary" in r.json()["detail"]["message"]
    for path, code in [("/api/v1/ramps/77", "unknown_ramp")]:
        assert rapi.client.get(path, headers=rapi.h("viewer")).json()["detail"]["code"] == code
    r = rapi.client.post(
        "/api/v1/scheduled-flips/5/cancel",
        json={"reason": "x"},
        headers={**rapi.h("operator"), "If-Match": "1"},
    )
    assert r.status_code == 404 and r.json()["detail"]["code"] == "unknown_flip"


def test_cancel_and_resume_take_the_ramp_version(rapi: Api) -> None:
    ramp = _start(rapi).json()
    url = f"/api/v1/ramps/{ramp['id']}"
    body = {"reason": "enough for today"}
    r = rapi.client.post(
        url + "/resume", json=body, headers={**rapi.h("operator"), "If-Match": '"2"'}
    )
    assert r.status_code == 409 and r.json()["detail"]["code"] == "wrong_state"
    assert (
        rapi.client.post(url + "/cancel", json=body, headers=rapi.h("operator")).status_code == 428
    )
    r = rapi.client.post(
        url + "/cancel", json=body, headers={**rapi.h("operator"), "If-Match": '"2"'}
    )
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert _audit(rapi)[0] == ("ramp.cancel", "enough for today")


def test_with_approvals_an_enable_waits_for_another_operator(approving: Api) -> None:
    api = approving
    url = f"/api/v1/canaries/{COHORT}"
    r = api.client.patch(
        url,
        json={"enabled": True, "percentage": 20, "reason": "go"},
        headers={**api.h("operator"), "If-Match": _version(api)},
    )
    assert r.status_code == 202 and r.json()["state"] == "pending_approval", r.text
    flip_id = r.json()["id"]
    assert api.client.get(url, headers=api.h("viewer")).json()["enabled"] is False
    [pending] = api.client.get("/api/v1/approvals", headers=api.h("viewer")).json()
    assert (pending["subject"], pending["id"], pending["summary"]) == (
        "flip",
        flip_id,
        "enable at 20 % now",
    )
    approve = f"/api/v1/approvals/flip/{flip_id}/approve"
    mine = api.client.post(approve, json={"reason": "me"}, headers=api.h("operator"))
    assert mine.status_code == 403 and mine.json()["detail"]["code"] == "self_approval"
    viewer = api.client.post(approve, json={"reason": "v"}, headers=api.h("viewer"))
    assert viewer.status_code == 403 and viewer.json()["detail"]["code"] == "forbidden"
    r = api.client.post(
        approve, json={"reason": "checked the dashboards"}, headers=api.h("operator2")
    )
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    state = api.client.get(url, headers=api.h("viewer")).json()
    assert (state["enabled"], state["percentage"]) == (True, 20)
    assert [a for a, _r in _audit(api)] == ["canary.flip", "flip.approve", "flip.request"]
    # a disable never waits
    r = api.client.patch(
        url,
        json={"enabled": False, "reason": "INC-7"},
        headers={**api.h("operator"), "If-Match": _version(api)},
    )
    assert r.status_code == 200 and r.json()["changed"] is True


def test_with_approvals_a_ramp_waits_and_can_be_rejected(approving: Api) -> None:
    r = _start(approving)
    assert r.status_code == 202 and r.json()["state"] == "pending_approval"
    ramp_id = r.json()["id"]
    r = approving.client.post(
        f"/api/v1/approvals/ramp/{ramp_id}/reject",
        json={"reason": "not on a Friday"},
        headers={**approving.h("operator2"), "If-Match": '"1"'},
    )
    assert r.status_code == 200 and r.json()["state"] == "rejected"
    again = approving.client.post(
        f"/api/v1/approvals/ramp/{ramp_id}/approve",
        json={"reason": "late"},
        headers=approving.h("operator2"),
    )
    assert again.status_code == 409 and again.json()["detail"]["code"] == "wrong_state"
    r = approving.client.post(
        "/api/v1/approvals/rampx/1/approve", json={"reason": "x"}, headers=approving.h("operator2")
    )
    assert r.status_code == 422


def test_a_scheduled_flip_is_listed_and_cancelled(rapi: Api) -> None:
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
    body = {"cohort": COHORT, "enabled": True, "percentage": 5, "reason": "Monday"}
    r = rapi.client.post(
        "/api/v1/scheduled-flips", json={**body, "run_at": past}, headers=rapi.h("operator")
    )
    assert r.status_code == 422 and "not between now" in r.json()["detail"]["message"]
    naive = rapi.client.post(
        "/api/v1/scheduled-flips", json={**body, "run_at": soon[:19]}, headers=rapi.h("operator")
    )
    assert naive.status_code == 422
    r = rapi.client.post(
        "/api/v1/scheduled-flips", json={**body, "run_at": soon}, headers=rapi.h("operator")
    )
    assert r.status_code == 201 and r.json()["state"] == "scheduled", r.text
    flips = rapi.client.get("/api/v1/scheduled-flips?open=true", headers=rapi.h("viewer"))
    assert [f["id"] for f in flips.json()] == [r.json()["id"]]
    r = rapi.client.post(
        f"/api/v1/scheduled-flips/{r.json()['id']}/cancel",
        json={"reason": "moved to Tuesday"},
        headers={**rapi.h("operator"), "If-Match": '"1"'},
    )
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_a_missing_if_match_names_the_version_the_route_takes(rapi: Api) -> None:
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
    flip = rapi.client.post(
        "/api/v1/scheduled-flips",
        headers=rapi.h("operator"),
        json={"cohort": COHORT, "enabled": True, "run_at": soon, "reason": "Monday"},
    ).json()
    ramp = _start(rapi).json()
    reason = {"reason": "x"}
    for path, body, names in [
        (f"/api/v1/ramps/{ramp['id']}/cancel", reason, "the ramp's version"),
        (f"/api/v1/ramps/{ramp['id']}/resume", reason, "the ramp's version"),
        (f"/api/v1/scheduled-flips/{flip['id']}/cancel", reason, "the flip's version"),
        (f"/api/v1/canaries/{COHORT}/ramp", RAMP, "the cohort's version"),
    ]:
        r = rapi.client.post(path, json=body, headers=rapi.h("operator"))
        assert r.status_code == 428 and names in r.json()["detail"]["message"], (path, r.text)


def _decisions(api: Api, at: dt.datetime, runner: str, n: int) -> None:
    events = [
        {
            "event_id": uuid.uuid4().hex,
            "at": at.isoformat(),
            "deployment_id": f"{runner}-{i}",
            "host": "h",
            "pack": "turnout",
            "family": "qwen3",
            "runner": runner,
            "mode": "auto",
            "stage": "qwen3-canary",
            "reason_code": "DEFAULT",
            "rule_ids": [],
        }
        for i in range(n)
    ]
    r = api.client.post("/api/v1/decisions", json={"events": events}, headers=api.h("operator"))
    assert r.status_code == 200, r.text


def test_the_kill_switch_is_an_operators_and_says_who_still_runs_v2(rapi: Api) -> None:
    now = dt.datetime.now(dt.UTC)
    _decisions(rapi, now - dt.timedelta(hours=1), "v2", 3)
    _decisions(rapi, now - dt.timedelta(hours=1), "v1", 2)
    reach = rapi.client.get("/api/v1/kill-switch", headers=rapi.h("viewer")).json()
    assert (reach["engaged"], reach["v2_decided_before"]) == (False, 0)
    r = rapi.client.post(
        "/api/v1/kill-switch",
        json={"engaged": True, "reason": "V2 crashes"},
        headers=rapi.h("operator"),
    )
    assert r.status_code == 200 and r.json()["changed"] is True
    _decisions(rapi, now + dt.timedelta(minutes=1), "v2", 1)  # v2-0 again, pinned since
    later = now + dt.timedelta(minutes=2)
    reports = [
        {
            "report_id": uuid.uuid4().hex,
            "deployment_id": d,
            "pack": "turnout",
            "runner": runner,
            "family": "qwen3",
            "stage": "qwen3-canary",
            "window_start": (later - dt.timedelta(minutes=1)).isoformat(),
            "window_end": later.isoformat(),
            "num_requests": 10,
            "num_errors": 0,
        }
        for d, runner in [("v2-1", "v2"), ("v2-2", "v2"), ("v1-0", "v1")]
    ]
    reports.append(
        {
            **reports[1],
            "report_id": uuid.uuid4().hex,
            "runner": "v1",
            "window_end": (later + dt.timedelta(seconds=30)).isoformat(),
        }
    )
    r = rapi.client.post("/api/v1/health", json={"reports": reports}, headers=rapi.h("operator"))
    assert r.status_code == 200, r.text
    reach = rapi.client.get("/api/v1/kill-switch", headers=rapi.h("viewer")).json()
    # v2-2 restarted on V1 (its latest report): one engine still runs V2
    assert (
        reach["v2_decided_before"],
        reach["v2_decided_after"],
        reach["v2_engines_reporting"],
    ) == (2, 1, 1)


def test_webhooks_are_an_admins_and_show_their_secret_once(rapi: Api) -> None:
    body = {
        "url": "https://hooks.example.com/hook",
        "kinds": ["flip", "gate_failure"],
        "description": "on-call",
    }
    assert (
        rapi.client.post("/api/v1/webhooks", json=body, headers=rapi.h("operator")).status_code
        == 403
    )
    r = rapi.client.post("/api/v1/webhooks", json=body, headers=rapi.h("admin"))
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["secret"].startswith("whsec_") and made["secret_prefix"] == made["secret"][:10]
    [listed] = rapi.client.get("/api/v1/webhooks", headers=rapi.h("admin")).json()
    assert "secret" not in listed and listed["kinds"] == ["flip", "gate_failure"]
    for bad in [
        {**body, "url": "file:///etc/passwd"},
        {**body, "kinds": []},
        {**body, "kinds": ["nope"]},
        {**body, "secret": "short"},
        # URLs no POST can be sent to (an unclosed IPv6 bracket was a 500)
        {**body, "url": "http://["},
        {**body, "url": "http://[::1/hook"},
        {**body, "url": "http://h:99999/"},
        {**body, "url": "http://h:abc/"},
        {**body, "url": "http://a b/"},
        {**body, "url": "http://h/\tx"},
    ]:
        r = rapi.client.post("/api/v1/webhooks", json=bad, headers=rapi.h("admin"))
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"]["code"] in ("invalid_request", "invalid_change"), r.text
    rapi.client.patch(
        f"/api/v1/canaries/{COHORT}",
        json={"enabled": True, "reason": "go"},
        headers={**rapi.h("operator"), "If-Match": _version(rapi)},
    )
    outbox = rapi.client.get("/api/v1/webhooks/outbox", headers=rapi.h("admin")).json()
    assert outbox["counts"] == {"pending": 1, "delivered": 0, "dead": 0}
    entry = outbox["entries"][0]
    assert entry["kind"] == "flip" and entry["payload"]["cohort"] == COHORT
    r = rapi.client.post(f"/api/v1/webhooks/outbox/{entry['id']}/retry", headers=rapi.h("admin"))
    assert r.status_code == 409 and r.json()["detail"]["code"] == "wrong_state"
    r = rapi.client.post(
        f"/api/v1/webhooks/{made['id']}/remove", json={"reason": "gone"}, headers=rapi.h("admin")
    )
    assert r.status_code == 200 and r.json()["removed_at"] is not None
    assert rapi.client.get("/api/v1/webhooks", headers=rapi.h("admin")).json() == []
    r = rapi.client.post(
        "/api/v1/webhooks/99/remove", json={"reason": "x"}, headers=rapi.h("admin")
    )
    assert r.status_code == 404 and r.json()["detail"]["code"] == "unknown_webhook"


def test_a_token_with_the_longest_name_can_engage_the_kill_switch_and_ramp(rapi: Api) -> None:
    """A name of 128 characters (what POST /tokens takes) and " (token N)" were longer than
    the 128 characters the actor columns hold: on PostgreSQL every change of that token was a
    422 unstorable_value, the kill switch included (SQLite stored it)."""
    from turnout.dashboard.store import tokens

    with rapi.services.db.write_session() as s:
        _row, token = tokens.create_token(
            session=s, name="n" * 128, role=tokens.Role.operator, actor="t"
        )
        s.commit()
    h = {"Authorization": f"Bearer {token}"}
    r = rapi.client.post(
        "/api/v1/kill-switch", json={"engaged": True, "reason": "incident"}, headers=h
    )
    assert r.status_code == 200, r.text
    r = rapi.client.post(
        f"/api/v1/canaries/{COHORT}/ramp", json=RAMP, headers={**h, "If-Match": _version(rapi)}
    )
    assert r.status_code == 201, r.text
    [entry, engaged] = rapi.client.get("/api/v1/audit?limit=2", headers=rapi.h("viewer")).json()
    assert (entry["action"], engaged["action"]) == ("ramp.start", "kill_switch.set")
    assert len(entry["actor"]) <= 128 and entry["actor"].endswith(")")
    assert entry["actor"].startswith("nnnn") and " (token " in entry["actor"]
    assert r.json()["requested_by"] == entry["actor"]


def test_parity_evidence_keeps_its_test_counts(rapi: Api) -> None:
    body = {
        "family": "qwen3",
        "suite": "tests/parity",
        "result": "fail",
        "num_tests": 120,
        "num_failures": 2,
        "num_errors": 1,
        "num_skipped": 4,
    }
    r = rapi.client.post("/api/v1/evidence", json=body, headers=rapi.h("operator"))
    assert r.status_code == 201 and r.json()["num_failures"] == 2
    [row] = rapi.client.get("/api/v1/evidence", headers=rapi.h("viewer")).json()
    assert (row["num_tests"], row["num_errors"], row["num_skipped"]) == (120, 1, 4)


@pytest.mark.parametrize(
    ("counts", "says"),
    [
        # Before: each was stored, and a parity gate passed on the first two.
        ({"result": "pass", "num_tests": 10, "num_failures": 10}, "a pass has none"),
        ({"result": "pass", "num_tests": 0}, "make a fail"),
        ({"result": "pass", "num_tests": 3, "num_skipped": 3}, "make a fail"),
        ({"result": "pass", "num_tests": 2, "num_errors": 1, "num_skipped": 2}, "more than"),
        ({"result": "fail", "num_tests": 5, "num_failures": 0, "num_errors": 0}, "make a pass"),
    ],
    ids=["pass-all-failed", "pass-no-test", "pass-all-skipped", "over-count", "fail-clean"],
)
def test_evidence_whose_result_disagrees_with_its_counts_is_refused(
    rapi: Api, counts: dict[str, object], says: str
) -> None:
    base = {"family": "qwen3", "suite": "tests/parity"}
    r = rapi.client.post("/api/v1/evidence", json={**base, **counts}, headers=rapi.h("operator"))
    assert r.status_code == 422 and says in r.text, r.text
    assert rapi.client.get("/api/v1/evidence", headers=rapi.h("viewer")).json() == []
    for fine in (
        {"result": "pass"},  # no counts: nothing to disagree with
        {"result": "fail", "num_tests": 0},  # nothing ran: not a pass
        {"result": "pass", "num_tests": 5, "num_skipped": 4},
    ):
        r = rapi.client.post("/api/v1/evidence", json={**base, **fine}, headers=rapi.h("operator"))
        assert r.status_code == 201, (fine, r.text)


def test_the_background_passes_run_what_is_due_and_leave_an_idle_store_alone(rapi: Api) -> None:
    from turnout.dashboard import background

    services = rapi.services
    now = dt.datetime.now(dt.UTC)
    assert background.tick(services, now).flips == []
    body = {
        "cohort": COHORT,
        "enabled": True,
        "percentage": 30,
        "reason": "at noon",
        "run_at": (now + dt.timedelta(hours=1)).isoformat(),
    }
    assert (
        rapi.client.post(
            "/api/v1/scheduled-flips", json=body, headers=rapi.h("operator")
        ).status_code
        == 201
    )
    assert background.tick(services, now).flips == []  # not due yet
    report = background.tick(services, now + dt.timedelta(hours=2))
    assert [(f.cohort, f.changed) for f in report.flips] == [(COHORT, True)]
    state = rapi.client.get(f"/api/v1/canaries/{COHORT}", headers=rapi.h("viewer")).json()
    assert (state["enabled"], state["percentage"]) == (True, 30)
    assert background.deliver(services, now).delivered == []  # no subscription: idle
