"""Engine registration on both backends: ``PUT /api/v1/engines/{id}`` (first 201, heartbeat
200), Prometheus' HTTP SD body at ``/api/v1/prometheus/targets`` with the rollout's labels,
``GET /api/v1/engines`` naming the engines a kill switch left on an old decision, a clean
exit (``DELETE``) and the heartbeat's time-to-live; bad registrations are 422 and change
nothing; roles hold."""

from __future__ import annotations

import datetime as dt
from typing import Any

from service_helpers import LOOPBACK_EGRESS, Api

from turnout.dashboard.store import engines as engine_store
from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.wire import engine_registration


def registration(engine_id: str, deployment_id: str, port: int, **over: Any) -> dict[str, Any]:
    """A real registration: the turnout pack's decision for a Qwen3 deployment (V2 through
    the qwen3-canary stage)."""
    config = from_spec({"architecture": "Qwen3ForCausalLM", "deployment_id": deployment_id})
    decision = decide(config, pack=load_pack("turnout"))
    body = engine_registration(
        decision,
        config,
        engine_id=engine_id,
        address=f"127.0.0.1:{port}",
        engine="turnout",
        vllm_version="0.33.0",
        pack="turnout",
        deployment_id=deployment_id,
        host="node-1",
    ).model_dump(mode="json")
    return {**body, **over}


def put(api: Api, body: dict[str, Any], role: str = "operator") -> Any:
    return api.client.put(f"/api/v1/engines/{body['engine_id']}", json=body, headers=api.h(role))


def test_register_heartbeat_targets_and_goodbye(api: Api) -> None:
    first = put(api, registration("e1", "d1", 9001))
    assert first.status_code == 201, first.text
    assert put(api, registration("e1", "d1", 9001)).status_code == 200  # the heartbeat
    assert put(api, registration("e2", "d2", 9002)).status_code == 201

    targets = api.client.get("/api/v1/prometheus/targets", headers=api.h("viewer"))
    assert targets.status_code == 200
    groups = {g["targets"][0]: g["labels"] for g in targets.json()}
    assert set(groups) == {"127.0.0.1:9001", "127.0.0.1:9002"}
    labels = groups["127.0.0.1:9001"]
    assert labels["__metrics_path__"] == "/metrics" and labels["__scheme__"] == "http"
    assert labels["turnout_deployment"] == "d1"
    assert labels["turnout_stage"] == "qwen3-canary"
    assert labels["turnout_family"] == "qwen3"
    assert labels["turnout_runner"] == "v2"
    assert labels["turnout_cohort"] == "canary"
    assert labels["vllm_version"] == "0.33.0"
    assert labels["turnout_decision_digest"]

    assert api.client.delete("/api/v1/engines/e1", headers=api.h("operator")).status_code == 204
    assert api.client.delete("/api/v1/engines/e1", headers=api.h("operator")).status_code == 404
    left = api.client.get("/api/v1/prometheus/targets", headers=api.h("viewer")).json()
    assert [g["targets"] for g in left] == [["127.0.0.1:9002"]]
    # Registering again after the goodbye is a new start.
    assert put(api, registration("e1", "d1", 9001)).status_code == 201


def test_kill_switch_lists_the_engines_still_on_v2(api: Api) -> None:
    for i in range(3):
        assert put(api, registration(f"e{i}", f"d{i}", 9100 + i)).status_code == 201
    before = api.client.get("/api/v1/engines", headers=api.h("viewer")).json()
    assert before["num_engines"] == 3 and before["num_stale"] == 0
    assert {e["expected_runner"] for e in before["engines"]} == {"v2"}

    engaged = api.client.post(
        "/api/v1/kill-switch",
        json={"engaged": True, "reason": "V2 incident"},
        headers=api.h("operator"),
    )
    assert engaged.status_code == 200, engaged.text
    stale = api.client.get("/api/v1/engines?stale=true", headers=api.h("viewer")).json()
    assert stale["num_stale"] == 3
    assert {e["address"] for e in stale["engines"]} == {"127.0.0.1:9100", "127.0.0.1:9101",
                                                         "127.0.0.1:9102"}  # fmt: skip
    assert all(e["runner"] == "v2" and e["expected_runner"] == "v1" for e in stale["engines"])

    # One engine restarts on V1 (a new process, a new id; the old one said goodbye).
    assert api.client.delete("/api/v1/engines/e0", headers=api.h("operator")).status_code == 204
    restarted = registration("e0b", "d0", 9100, runner="v1", cohort="baseline")
    assert put(api, restarted).status_code == 201
    after = api.client.get("/api/v1/engines?stale=true", headers=api.h("viewer")).json()
    assert after["num_stale"] == 2
    assert "127.0.0.1:9100" not in {e["address"] for e in after["engines"]}


def test_heartbeat_time_to_live(api: Api) -> None:
    assert put(api, registration("e1", "d1", 9001)).status_code == 201
    ttl = dt.timedelta(seconds=api.services.settings.engine_ttl_s)
    now = dt.datetime.now(dt.UTC)
    with api.services.db.read_session() as session:
        assert [e.engine_id for e in engine_store.live(session=session, now=now, ttl=ttl)] == ["e1"]
        later = now + ttl + dt.timedelta(seconds=1)
        assert engine_store.live(session=session, now=later, ttl=ttl) == []


def test_bad_registrations_are_refused_alone(api: Api) -> None:
    good = registration("e1", "d1", 9001)
    cases = [
        ("/api/v1/engines/other", good),  # the path's id is not the body's
        ("/api/v1/engines/e1", {**good, "pack": "vllm-0.33"}),
        ("/api/v1/engines/e1", {**good, "stage": "no-such-stage"}),
        ("/api/v1/engines/e1", {**good, "family": "no-such-family"}),
        ("/api/v1/engines/e1", {**good, "family": "llama"}),  # not in stage qwen3-canary
        ("/api/v1/engines/e1", {**good, "address": "127.0.0.1"}),
        ("/api/v1/engines/e1", {**good, "address": "127.0.0.1:70000"}),
        ("/api/v1/engines/e1", {**good, "address": "0.0.0.0:8000"}),  # every interface
        ("/api/v1/engines/e1", {**good, "address": "[::]:8000"}),
        ("/api/v1/engines/e1", {**good, "metrics_path": "metrics"}),
        ("/api/v1/engines/e1", {**good, "runner": "v3"}),
        ("/api/v1/engines/e1", {**good, "extra": 1}),
        ("/api/v1/engines/e1", [1, 2]),
    ]
    for url, body in cases:
        got = api.client.put(url, json=body, headers=api.h("operator"))
        assert got.status_code == 422, (body, got.text)
        assert "code" in got.json()["error"] if "error" in got.json() else got.json()
    raw = api.client.put(
        "/api/v1/engines/e1", content=b"{not json", headers={**api.h("operator"),
                                                             "content-type": "application/json"}
    )  # fmt: skip
    assert raw.status_code in (400, 422)
    assert api.client.get("/api/v1/engines", headers=api.h("viewer")).json()["num_engines"] == 0


def test_roles(api: Api) -> None:
    body = registration("e1", "d1", 9001)
    assert put(api, body, role="viewer").status_code == 403
    assert put(api, body, role=None).status_code == 401
    assert api.client.get("/api/v1/prometheus/targets").status_code == 401
    assert put(api, body).status_code == 201


def test_served_address_of_a_vllm_serve_line() -> None:
    from turnout.oracle.launch import served_address

    assert served_address(["vllm", "serve", "m"], "node-1") == ("node-1:8000", "http")
    line = ["vllm", "serve", "m", "--host", "10.0.0.7", "--port=9000"]
    assert served_address(line, "node-1") == ("10.0.0.7:9000", "http")
    line = ["vllm", "serve", "m", "--host=0.0.0.0", "--ssl-certfile", "c.pem"]
    assert served_address(line, "node-1") == ("node-1:8000", "https")
    assert served_address(["vllm", "serve", "m", "--host", "::1"], "n") == ("[::1]:8000", "http")


def test_a_flip_sends_one_restart_notice_naming_the_engines(api: Api) -> None:
    from turnout.dashboard.background import restart_notices
    from turnout.dashboard.store import audit, webhooks

    with api.services.db.write_session() as s:
        webhooks.add_webhook(
            egress=LOOPBACK_EGRESS,
            session=s,
            url="http://127.0.0.1:9/hook",
            kinds=["restart_required"],
            actor="t",
        )
        s.commit()
    for i in range(2):
        assert put(api, registration(f"e{i}", f"d{i}", 9200 + i)).status_code == 201
    now = dt.datetime.now(dt.UTC)
    # The service's own ticker runs beside the test and may be first: either says it.
    assert restart_notices(api.services, now) in (0, None)  # nobody is stale
    assert restart_notices(api.services, now) is None  # the same state: nothing to say
    engaged = api.client.post(
        "/api/v1/kill-switch",
        json={"engaged": True, "reason": "V2 incident"},
        headers=api.h("operator"),
    )
    assert engaged.status_code == 200, engaged.text
    api.services.policy.invalidate()
    assert restart_notices(api.services, now) in (2, None)
    assert restart_notices(api.services, now) is None  # once per state, however many passes
    with api.services.db.read_session() as s:
        (entry,) = [
            e for e in audit.list_entries(session=s) if e.action == "engines.restart_required"
        ]
        assert entry.after is not None and entry.after["num_engines"] == 2
        (sent,) = webhooks.list_outbox(session=s)
        assert sent.kind == "restart_required"
        assert {e["address"] for e in sent.payload["engines"]} == {
            "127.0.0.1:9200",
            "127.0.0.1:9201",
        }


def test_the_pages_list_the_engines_a_kill_switch_left_on_v2(api: Api) -> None:
    for i in range(2):
        assert put(api, registration(f"e{i}", f"d{i}", 9300 + i)).status_code == 201
    api.sign_in("viewer")
    before = api.client.get("/canaries")
    assert before.status_code == 200
    assert 'id="stale-engines-none"' in before.text and "2 registered engines" in before.text
    engaged = api.client.post(
        "/api/v1/kill-switch",
        json={"engaged": True, "reason": "V2 incident"},
        headers=api.h("operator"),
    )
    assert engaged.status_code == 200
    api.services.policy.invalidate()
    after = api.client.get("/canaries").text
    assert 'id="stale-engines"' in after
    assert "2 engines still on an old decision" in after
    assert "127.0.0.1:9300" in after and "127.0.0.1:9301" in after
    assert after.count("restart required") == 2
    # The deployment page lists its own engine; the deployment needs a recorded decision.
    events = api.client.post(
        "/api/v1/decisions",
        json={
            "events": [
                {
                    "event_id": "ev-d0",
                    "at": dt.datetime.now(dt.UTC).isoformat(),
                    "deployment_id": "d0",
                    "pack": "turnout",
                    "family": "qwen3",
                    "runner": "v2",
                    "mode": "auto",
                    "stage": "qwen3-canary",
                    "reason_code": "TARGETING_MATCH",
                }
            ]
        },
        headers=api.h("operator"),
    )
    assert events.status_code == 200, events.text
    page = api.client.get("/deployments/d0").text
    assert "127.0.0.1:9300" in page and "127.0.0.1:9301" not in page
    assert "restart required" in page


def test_a_breakers_registrations_are_refused_or_bounded(api: Api) -> None:
    """Cases a breaker found: a year-1 start time was a 500, a bracketed address that is no
    IPv6 address was served as a target, a config of a megabyte was stored, and a process
    restarted at the same address was listed twice (two cohorts scraped from one port)."""
    good = registration("e1", "d1", 9001)
    for over in (
        {"started_at": "0001-01-01T00:00:00+14:00"},
        {"started_at": "9999-12-31T00:00:00+00:00"},
        {"address": "[:::]:80"},
        {"address": "[....]:80"},
        {"config": {"architecture": "Qwen3ForCausalLM", "pad": "x" * 100_000}},
    ):
        got = put(api, {**good, **over})
        assert got.status_code == 422, (over, got.text)
    assert put(api, good).status_code == 201
    again = registration("e2", "d1", 9001, runner="v1", cohort="baseline")  # restarted there
    assert put(api, again).status_code == 201
    targets = api.client.get("/api/v1/prometheus/targets", headers=api.h("viewer")).json()
    assert [(g["targets"], g["labels"]["turnout_engine_id"]) for g in targets] == [
        (["127.0.0.1:9001"], "e2")
    ]


def test_many_stale_engines_make_one_bounded_notice(api: Api) -> None:
    from turnout.dashboard.background import restart_notices
    from turnout.dashboard.store import webhooks

    with api.services.db.write_session() as s:
        webhooks.add_webhook(
            egress=LOOPBACK_EGRESS,
            session=s,
            url="http://127.0.0.1:9/hook",
            kinds=["restart_required"],
            actor="t",
        )
        s.commit()
    for i in range(230):
        assert put(api, registration(f"e{i}", f"d{i}", 10_000 + i)).status_code == 201
    restart_notices(api.services, dt.datetime.now(dt.UTC))
    api.client.post(
        "/api/v1/kill-switch", json={"engaged": True, "reason": "x"}, headers=api.h("operator")
    )
    api.services.policy.invalidate()
    restart_notices(api.services, dt.datetime.now(dt.UTC))
    with api.services.db.read_session() as s:
        (sent,) = webhooks.list_outbox(session=s)
        assert sent.payload["num_engines"] == 230 and len(sent.payload["engines"]) == 200
