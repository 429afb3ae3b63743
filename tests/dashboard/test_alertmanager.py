"""Alertmanager's webhook receiver (``POST /api/v1/alertmanager``) in-process on SQLite and
PostgreSQL: a receiver's token, its rules (pause, rollback, kill switch), one action per stage
and firing however many alerts come, resolved alerts acting on nothing, the audit entries and
notifications of each action, 401s and 422s that change nothing (and random bodies that never
get a 5xx), the configuration file refused naming its line, and a real Alertmanager
(``/usr/bin/prometheus-alertmanager``, Debian's package) delivering to a real service."""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_helpers import skip_under_a_shifted_clock
from service_helpers import Api, LiveService, free_port, make_tokens, role_tokens, start_service

from turnout.dashboard.alertmanager import AlertConfigError, load_receivers
from turnout.dashboard.store import alerts as alert_store
from turnout.dashboard.store.models_rollout import AlertReceipt

COHORT = "llama-mistral-dense"  # off by default
URL = "/api/v1/alertmanager"
SRE_TOKEN = "am_sre_4bd7c1f0e2a94d0f9d3c6b8a"
BOT_TOKEN = "am_bot_91e0aa3f5c7d4e2b8f6a0c1d"
GENERATOR = "http://prometheus.example:9090/graph?g0.expr=turnout_engine_error_rate+%3E+0.05"
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")
CONFIG = """\
receivers:
  - name: sre-pager
    token_sha256: {sre}
    rules:
      - match: {{severity: critical}}
        action: kill_switch
      - match: {{severity: page, alertname: V2ErrorBudgetBurn}}
        action: rollback
      - match_re: {{severity: "page|warning"}}
        action: pause
  - name: canary-bot
    token_env: TURNOUT_TEST_AM_BOT_TOKEN
    rules:
      - match: {{team: rollout}}
        action: pause
"""
RAMP = {
    "steps": [{"percentage": 10, "bake_s": 600}, {"percentage": 50, "bake_s": 600}],
    "reason": "parity green on H200",
}
# Two hours before the run, whatever its date: receipts resolved 30 days before "now" are
# deleted, so a fixed date would start failing a month later.
STARTS = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).replace(microsecond=0)


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "alertmanager-receivers.yaml"
    path.write_text(CONFIG.format(sre=_sha(SRE_TOKEN)))
    return path


@pytest.fixture
def am(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    from fastapi.testclient import TestClient

    from turnout.dashboard.app import create_app
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings

    monkeypatch.setenv("TURNOUT_TEST_AM_BOT_TOKEN", BOT_TOKEN)
    services = Services.build(
        Settings(
            database_url=db_url,
            demo=False,
            snapshot_ttl_s=0,
            background=False,
            alertmanager_config=_config(tmp_path),
        )
    )
    with TestClient(create_app(services=services)) as client:
        yield Api(client, services, role_tokens(services.db))


def alert(
    fingerprint: str = "1a30ba71cca2921f",
    *,
    status: str = "firing",
    starts: dt.datetime = STARTS,
    generator: str = GENERATOR,
    **labels: str,
) -> dict[str, Any]:
    """One alert of a notification, as Alertmanager writes it."""
    labels = {"alertname": "V2LatencyHigh", "severity": "page", "turnout_stage": COHORT, **labels}
    return {
        "status": status,
        "labels": {k: v for k, v in labels.items() if v != ""},
        "annotations": {"summary": "V2 is slower than V1", "runbook_url": "https://runbooks/x"},
        "startsAt": starts.isoformat().replace("+00:00", "Z"),
        "endsAt": "0001-01-01T00:00:00Z"
        if status == "firing"
        else (starts + dt.timedelta(minutes=5)).isoformat(),
        "generatorURL": generator,
        "fingerprint": fingerprint,
    }


def notification(*alerts: dict[str, Any]) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4) around ``alerts``."""
    statuses = {a["status"] for a in alerts}
    return {
        "version": "4",
        "groupKey": '{}/{severity="page"}:{alertname="V2LatencyHigh"}',
        "truncatedAlerts": 0,
        "status": "firing" if "firing" in statuses else "resolved",
        "receiver": "turnout",
        "groupLabels": {"alertname": "V2LatencyHigh"},
        "commonLabels": {"severity": "page"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example:9093",
        "alerts": list(alerts),
    }


def post(api: Api, body: Any, token: str | None = SRE_TOKEN, query: str = "") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, bytes):
        return api.client.post(
            URL + query, content=body, headers={**headers, "Content-Type": "application/json"}
        )
    return api.client.post(URL + query, json=body, headers=headers)


def start_ramp(api: Api, cohort: str = COHORT) -> dict[str, Any]:
    version = api.client.get(f"/api/v1/canaries/{cohort}", headers=api.h("viewer")).headers["ETag"]
    r = api.client.post(
        f"/api/v1/canaries/{cohort}/ramp",
        json=RAMP,
        headers={**api.h("operator"), "If-Match": version},
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def ramp_state(api: Api, ramp_id: int) -> str:
    return str(api.client.get(f"/api/v1/ramps/{ramp_id}", headers=api.h("viewer")).json()["state"])


def audit(api: Api) -> list[dict[str, Any]]:
    entries = api.client.get("/api/v1/audit?limit=1000", headers=api.h("viewer")).json()
    return [e for e in entries if e["action"] != "token.create"]


def receipts(api: Api) -> list[dict[str, Any]]:
    r = api.client.get("/api/v1/alertmanager/receipts?limit=1000", headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    return list(r.json())


def test_a_page_pauses_the_stages_ramp_once_per_firing(am: Api) -> None:
    ramp = start_ramp(am)
    hook = am.client.post(
        "/api/v1/webhooks",
        json={"url": "https://hooks.example/t", "kinds": ["gate_failure"]},
        headers=am.h("admin"),
    )
    assert hook.status_code == 201, hook.text
    r = post(am, notification(alert(pod="v2-7")))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["receiver"] == "sre-pager" and answer["outcomes"] == {"acted": 1}
    [taken] = answer["actions"]
    assert (taken["action"], taken["cohort"]) == ("pause", COHORT)
    assert ramp_state(am, ramp["id"]) == "paused"
    entry = audit(am)[0]
    assert (entry["action"], entry["actor"], entry["id"]) == (
        "ramp.pause",
        "alertmanager:sre-pager",
        taken["audit_id"],
    )
    for part in ("V2LatencyHigh", GENERATOR, 'pod="v2-7"', f'turnout_stage="{COHORT}"'):
        assert part in entry["reason"], (part, entry["reason"])
    assert entry["after"]["state"] == "paused" and entry["target"] == f"cohort:{COHORT}"
    # notified as a gate failure is, with the alert
    [delivery] = am.client.get("/api/v1/webhooks/outbox", headers=am.h("admin")).json()["entries"]
    assert delivery["kind"] == "gate_failure"
    payload = delivery["payload"]
    assert payload["action"] == "ramp.pause" and payload["ramp_id"] == ramp["id"]
    assert payload["alert"]["generatorURL"] == GENERATOR
    assert payload["alert"]["labels"]["pod"] == "v2-7"
    # an operator resumes; the same firing, sent again (repeat_interval), acts no more
    version = am.client.get(f"/api/v1/ramps/{ramp['id']}", headers=am.h("viewer")).headers["ETag"]
    r = am.client.post(
        f"/api/v1/ramps/{ramp['id']}/resume",
        json={"reason": "a noisy node, drained"},
        headers={**am.h("operator"), "If-Match": version},
    )
    assert r.status_code == 200, r.text
    again = post(am, notification(alert(pod="v2-7")))
    assert again.json()["outcomes"] == {"duplicate": 1} and again.json()["actions"] == []
    assert ramp_state(am, ramp["id"]) == "active"
    # a new firing of the same alert (a new startsAt) pauses it again
    later = post(am, notification(alert(starts=STARTS + dt.timedelta(hours=1))))
    assert later.json()["outcomes"] == {"acted": 1}
    assert ramp_state(am, ramp["id"]) == "paused"
    [newest, older] = receipts(am)
    assert (newest["outcome"], older["outcome"]) == ("acted", "acted")
    assert older["labels"]["pod"] == "v2-7" and older["generator_url"] == GENERATOR
    assert older["audit_id"] == taken["audit_id"] and older["cohort"] == COHORT


def test_a_rollback_ends_the_ramp_and_disables_the_stage(am: Api) -> None:
    ramp = start_ramp(am)
    r = post(am, notification(alert(alertname="V2ErrorBudgetBurn")))
    assert r.json()["outcomes"] == {"acted": 1}, r.text
    assert ramp_state(am, ramp["id"]) == "rolled_back"
    cohort = am.client.get(f"/api/v1/canaries/{COHORT}", headers=am.h("viewer")).json()
    assert cohort["enabled"] is False
    entry = audit(am)[0]
    assert (entry["action"], entry["actor"]) == ("ramp.rollback", "alertmanager:sre-pager")
    assert GENERATOR in entry["reason"] and "V2ErrorBudgetBurn" in entry["reason"]
    # a stage enabled by hand, without a ramp, is disabled (qwen3-canary is on by default)
    r = post(am, notification(alert("2b", alertname="V2ErrorBudgetBurn", turnout_stage="")))
    assert r.json()["outcomes"] == {"no_stage": 1}
    r = post(
        am,
        notification(alert("3c", alertname="V2ErrorBudgetBurn", turnout_stage="qwen3-canary")),
    )
    assert r.json()["outcomes"] == {"acted": 1}
    qwen = am.client.get("/api/v1/canaries/qwen3-canary", headers=am.h("viewer")).json()
    assert qwen["enabled"] is False
    assert audit(am)[0]["action"] == "canary.flip"
    assert audit(am)[0]["actor"] == "alertmanager:sre-pager"
    # rolling back a stage that is off already changes nothing
    r = post(
        am,
        notification(alert("4d", alertname="V2ErrorBudgetBurn", turnout_stage="qwen3-canary")),
    )
    assert r.json()["outcomes"] == {"no_change": 1} and len(audit(am)) == 3


def test_a_critical_alert_engages_the_kill_switch(am: Api) -> None:
    r = post(am, notification(alert(severity="critical", turnout_stage="")))
    assert r.json()["outcomes"] == {"acted": 1}, r.text
    ks = am.client.get("/api/v1/kill-switch", headers=am.h("viewer")).json()
    assert ks["engaged"] is True
    entry = audit(am)[0]
    assert (entry["action"], entry["actor"]) == ("kill_switch.set", "alertmanager:sre-pager")
    assert GENERATOR in entry["reason"] and 'severity="critical"' in entry["reason"]
    assert r.json()["actions"][0]["audit_id"] == entry["id"]
    # another critical alert finds it engaged: a receipt, no second audit entry
    r = post(am, notification(alert("ff00", severity="critical")))
    assert r.json()["outcomes"] == {"no_change": 1} and len(audit(am)) == 1
    # decisions follow at once (the snapshot was dropped)
    r = am.client.post(
        "/api/v1/decide",
        json={"config": {"architecture": "Qwen3ForCausalLM"}},
        headers=am.h("viewer"),
    )
    assert r.status_code == 200 and r.json()["runner"] == "v1", r.text


def test_a_storm_of_a_thousand_alerts_acts_once_per_stage(am: Api) -> None:
    ramp = start_ramp(am)
    other = start_ramp(am, "granite-moe")
    storm = [alert(f"{i:016x}", pod=f"v2-{i}") for i in range(990)]
    storm += [alert(f"{i:016x}", turnout_stage="granite-moe") for i in range(990, 1000)]
    r = post(am, notification(*storm))
    assert r.status_code == 200, r.text
    assert r.json()["outcomes"] == {"acted": 2, "no_change": 998}
    assert sorted(a["cohort"] for a in r.json()["actions"]) == ["granite-moe", COHORT]
    assert ramp_state(am, ramp["id"]) == ramp_state(am, other["id"]) == "paused"
    assert [e["action"] for e in audit(am)].count("ramp.pause") == 2
    # the same storm again (the second Alertmanager of an HA pair): nothing more
    r = post(am, notification(*storm))
    assert r.json()["outcomes"] == {"duplicate": 1000}
    # one alert a thousand times in one notification acts once
    same = [alert("abcdef", severity="critical")] * 1000
    r = post(am, notification(*same))
    assert r.json()["outcomes"] == {"acted": 1, "duplicate": 999}
    assert [e["action"] for e in audit(am)].count("kill_switch.set") == 1
    assert len(receipts(am)) == 1000  # the last page: 1,001 receipts in all
    metrics = am.client.get("/metrics").text
    assert 'turnout_alerts_received_total{receiver="sre-pager",status="firing"} 3000.0' in metrics
    assert 'turnout_alert_actions_total{action="pause"} 2.0' in metrics
    assert 'turnout_alert_actions_total{action="kill_switch"} 1.0' in metrics


def test_concurrent_deliveries_of_a_storm_act_once(am: Api) -> None:
    """Alertmanager's HA pair sends each notification from both instances at once: the
    receipts' uniqueness and the row locks let one act."""
    ramp = start_ramp(am)
    storm = [alert(f"{i:016x}") for i in range(200)] + [alert("ks", severity="critical")]
    items = [
        alert_store.ReceivedAlert(
            fingerprint=a["fingerprint"],
            status="firing",
            starts_at=STARTS,
            ends_at=None,
            labels=a["labels"],
            generator_url=GENERATOR,
            action=alert_store.Action.kill_switch
            if a["labels"]["severity"] == "critical"
            else alert_store.Action.pause,
            stage=COHORT,
        )
        for a in storm
    ]
    barrier = threading.Barrier(4)
    reports: list[alert_store.Report] = []
    errors: list[BaseException] = []

    def deliver(order: int) -> None:
        try:
            barrier.wait()
            with am.services.db.write_session() as session:
                report = alert_store.receive(
                    session=session,
                    receiver="sre-pager",
                    alerts=items[::-1] if order % 2 else items,
                )
                session.commit()
            reports.append(report)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(len(r.actions) for r in reports) == 2
    assert sum(r.outcomes["duplicate"] for r in reports) == 3 * len(items)
    assert ramp_state(am, ramp["id"]) == "paused"
    actions = [e["action"] for e in audit(am)]
    assert actions.count("ramp.pause") == 1 and actions.count("kill_switch.set") == 1


def test_a_resolved_alert_resumes_nothing(am: Api) -> None:
    ramp = start_ramp(am)
    r = post(am, notification(alert("77", status="resolved")))
    assert r.json()["outcomes"] == {"resolved": 1}
    assert ramp_state(am, ramp["id"]) == "active" and audit(am)[0]["action"] == "ramp.start"
    assert post(am, notification(alert("88"))).json()["outcomes"] == {"acted": 1}
    r = post(am, notification(alert("88", status="resolved")))
    assert r.json()["outcomes"] == {"resolved": 1}
    assert ramp_state(am, ramp["id"]) == "paused"  # an operator resumes
    by_fp = {x["fingerprint"]: x for x in receipts(am)}
    assert by_fp["88"]["outcome"] == "acted" and by_fp["88"]["resolved_at"] is not None
    assert by_fp["77"]["outcome"] == "resolved" and by_fp["77"]["status"] == "resolved"
    assert [e["action"] for e in audit(am)] == ["ramp.pause", "ramp.start"]


def test_the_stage_comes_from_the_family_or_the_deployment(am: Api) -> None:
    ramp = start_ramp(am)
    r = post(am, notification(alert("f1", turnout_stage="", turnout_family="mistral")))
    assert r.json()["actions"][0]["cohort"] == COHORT
    assert ramp_state(am, ramp["id"]) == "paused"
    outcomes = {
        "no_rule": alert("n1", severity="info"),
        "unknown_stage": alert("n2", turnout_stage="Llama"),
        "no_ramp": alert("n3", turnout_stage="granite-moe"),
    }
    for outcome, one in outcomes.items():
        r = post(am, notification(one))
        assert r.json()["outcomes"] == {outcome: 1}, (outcome, r.text)
    # a deployment's recorded stage (its latest decision's)
    from turnout.dashboard.store.models import Deployment

    with am.services.db.write_session() as s:
        s.add(
            Deployment(
                deployment_id="prod-granite-1",
                event_id="e1",
                at=STARTS,
                pack="turnout",
                family="granite_moe",
                runner="v2",
                mode="auto",
                stage="granite-moe",
                reason_code="STAGE_ON",
                rule_ids=[],
            )
        )
        s.commit()
    other = start_ramp(am, "granite-moe")
    r = post(am, notification(alert("d1", turnout_stage="", turnout_deployment="prod-granite-1")))
    assert r.json()["actions"][0]["cohort"] == "granite-moe", r.text
    assert ramp_state(am, other["id"]) == "paused"


def test_the_token_chooses_the_receiver_and_a_wrong_one_is_a_401(am: Api) -> None:
    ramp = start_ramp(am)
    body = notification(alert(team="rollout", severity="info"))
    for token, query in [
        (None, ""),
        ("nope", ""),
        (am.tokens["admin"], ""),  # an API token is no receiver's
        (SRE_TOKEN, "?receiver=canary-bot"),
        (BOT_TOKEN, "?receiver=sre-pager"),
    ]:
        r = post(am, body, token, query)
        assert r.status_code == 401, (token, query, r.text)
        detail = r.json()["detail"]
        assert detail["code"] in ("unauthenticated", "bad_token") and detail["message"]
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    r = post(am, b"not json at all", "nope")
    assert r.status_code == 401  # the token is checked before the body is read
    assert ramp_state(am, ramp["id"]) == "active" and receipts(am) == []
    r = post(am, body, BOT_TOKEN, "?receiver=canary-bot")
    assert r.json()["receiver"] == "canary-bot" and r.json()["outcomes"] == {"acted": 1}
    assert audit(am)[0]["actor"] == "alertmanager:canary-bot"
    r = post(am, body, SRE_TOKEN)  # sre-pager's rules: severity info matches none
    assert r.json()["outcomes"] == {"no_rule": 1}


def _valid() -> dict[str, Any]:
    return notification(alert(), alert("2"))


def _without(path: tuple[Any, ...]) -> dict[str, Any]:
    body = _valid()
    holder: Any = body
    for part in path[:-1]:
        holder = holder[part]
    del holder[path[-1]]
    return body


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = _valid()
    holder: Any = body
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return body


MALFORMED: list[tuple[str, Any]] = [
    ("not JSON", b"{'version': 4"),
    ("NaN", b'{"version": "4", "truncatedAlerts": NaN}'),
    ("a list", b"[]"),
    ("empty", b""),
    ("version 3", _with(("version",), "3")),
    ("version as a number", _with(("version",), 4)),
    ("no alerts", _without(("alerts",))),
    ("no status", _without(("status",))),
    ("alerts not a list", _with(("alerts",), {"0": alert()})),
    ("an alert's status", _with(("alerts", 0, "status"), "pending")),
    ("no fingerprint", _without(("alerts", 1, "fingerprint"))),
    ("a fingerprint with a space", _with(("alerts", 1, "fingerprint"), "a b")),
    ("a naive startsAt", _with(("alerts", 0, "startsAt"), "2026-12-04T09:30:00")),
    (
        "startsAt before year 1 in UTC",
        _with(("alerts", 0, "startsAt"), "0001-01-01T00:00:00+05:00"),
    ),
    ("startsAt not a time", _with(("alerts", 0, "startsAt"), "yesterday")),
    ("labels not strings", _with(("alerts", 0, "labels"), {"severity": 3})),
    ("a label of 1,025 characters", _with(("alerts", 0, "labels", "pod"), "x" * 1025)),
    ("a NUL in a label", _with(("alerts", 0, "labels", "pod"), "a\x00b")),
    ("65 labels", _with(("alerts", 0, "labels"), {f"l{i}": "v" for i in range(65)})),
    ("a generatorURL of 2,049", _with(("alerts", 0, "generatorURL"), "h" * 2049)),
    ("truncatedAlerts negative", _with(("truncatedAlerts",), -1)),
    ("5,001 alerts", _with(("alerts",), [alert(f"{i:x}") for i in range(5001)])),
]


@pytest.mark.parametrize(("what", "body"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_notification_is_a_422_that_changes_nothing(
    am: Api, what: str, body: Any
) -> None:
    ramp = start_ramp(am)
    before = audit(am)
    r = post(am, json.dumps(body).encode() if isinstance(body, dict) else body)
    assert r.status_code == 422, (what, r.status_code, r.text)
    detail = r.json()["detail"]
    assert detail["code"] == "invalid_request" and detail["message"], detail
    assert audit(am) == before and receipts(am) == []
    assert ramp_state(am, ramp["id"]) == "active"
    ks = am.client.get("/api/v1/kill-switch", headers=am.h("viewer")).json()
    assert ks["engaged"] is False


def test_a_body_over_the_size_bound_is_a_413(am: Api) -> None:
    r = post(am, b'{"alerts": [' + b" " * (9 * 1024 * 1024) + b"]}")
    assert r.status_code == 413 and r.json()["detail"]["code"] == "body_too_large"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _places(v, (*path, i))


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = copy.deepcopy(value)
    holder = out
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = new
    return out


def test_random_bodies_never_get_a_5xx(am: Api) -> None:
    seen: dict[int, int] = {}

    def check(raw: bytes) -> None:
        r = post(am, raw)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, r.text
        if r.status_code >= 400:
            detail = r.json()["detail"]
            assert detail["code"] and detail["message"], r.text

    fuzz = settings(
        deadline=None,
        database=None,
        derandomize=True,
        max_examples=150,
        suppress_health_check=list(HealthCheck),
    )

    @given(value=_JSON)
    @fuzz
    def any_json(value: Any) -> None:
        check(json.dumps(value).encode())

    @given(data=st.data(), new=_JSON)
    @fuzz
    def one_value_replaced(data: st.DataObject, new: Any) -> None:
        body = _valid()
        where = data.draw(st.sampled_from(list(_places(body))))
        check(json.dumps(_replace(body, where, new)).encode())

    @given(raw=st.binary(max_size=2048))
    @fuzz
    def any_bytes(raw: bytes) -> None:
        check(raw)

    any_json()
    one_value_replaced()
    any_bytes()
    assert seen.get(422, 0) > 100, seen


def _load(tmp_path: Path, text: str, **environ: str) -> Any:
    path = tmp_path / "receivers.yaml"
    path.write_text(text)
    return load_receivers(path, environ)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("receivers:\n  - name: a\n    rules: [\n", ":4: not YAML"),
        ("receivers: []\n", ":1: receivers: List should have at least 1 item"),
        (
            "receivers:\n  - name: a\n    token_sha256: " + "a" * 64 + "\n    rules:\n"
            "      - match: {severity: page}\n        action: resume\n",
            ":6: receivers[0].rules[0].action: Input should be 'pause', 'rollback' or",
        ),
        (
            "receivers:\n  - name: a\n    token_sha256: " + "a" * 64 + "\n    rules:\n"
            "      - match_re: {severity: '(page'}\n        action: pause\n",
            ":5: receivers[0].rules[0].match_re: Value error, match_re severity: '(page' is no",
        ),
        (
            "receivers:\n  - name: a\n    token_env: NOT_SET_HERE\n    rules:\n"
            "      - action: pause\n",
            ":2: receivers[0]: Value error, token_env: the variable NOT_SET_HERE is not set",
        ),
        (
            "receivers:\n  - name: a\n    token_sha256: " + "a" * 64 + "\n    rules:\n"
            "      - action: pause\n        colour: red\n",
            ":6: receivers[0].rules[0].colour: Extra inputs are not permitted",
        ),
        (
            "receivers:\n  - name: a\n    token_env: T\n    rules: [{action: pause}]\n"
            "  - name: b\n    token_sha256: " + _sha("tok") + "\n    rules: [{action: pause}]\n",
            ":5: receivers[1] has the token of receivers[0]",
        ),
        (
            "receivers:\n  - name: a\n    token_env: T\n    rules: [{action: pause}]\n"
            "  - name: a\n    token_env: U\n    rules: [{action: pause}]\n",
            ":5: receivers[1] has the name 'a' of receivers[0]",
        ),
    ],
)
def test_a_bad_configuration_is_refused_naming_its_line(
    tmp_path: Path, text: str, says: str
) -> None:
    with pytest.raises(AlertConfigError) as err:
        _load(tmp_path, text, T="tok", U="other")
    assert str(err.value).startswith(str(tmp_path / "receivers.yaml") + ":"), str(err.value)
    assert says in str(err.value), str(err.value)


def test_rules_match_exactly_and_by_regular_expression(tmp_path: Path) -> None:
    receivers = _load(tmp_path, CONFIG.format(sre=_sha(SRE_TOKEN)), TURNOUT_TEST_AM_BOT_TOKEN="b")
    sre = receivers.authenticate(SRE_TOKEN)
    assert sre is not None and receivers.authenticate("b", "canary-bot") is not None
    assert receivers.authenticate(SRE_TOKEN, "canary-bot") is None
    assert receivers.authenticate("") is None and receivers.authenticate("x" * 5000) is None
    assert sre.action_for({"severity": "critical"}) == "kill_switch"
    assert sre.action_for({"severity": "page", "alertname": "V2ErrorBudgetBurn"}) == "rollback"
    assert sre.action_for({"severity": "warning"}) == "pause"
    assert sre.action_for({"severity": "warnings"}) is None  # anchored, as Alertmanager's
    assert sre.action_for({}) is None


def test_the_service_refuses_to_start_on_a_bad_configuration(tmp_path: Path) -> None:
    bad = tmp_path / "am.yaml"
    bad.write_text("receivers:\n  - name: a\n    rules: nope\n")
    r = subprocess.run(
        [sys.executable, "-c", "from turnout.oracle.cli import main; main()", "serve"],
        env={
            "PATH": "/usr/bin:/bin",
            "TURNOUT_DATABASE_URL": f"sqlite:///{tmp_path / 't.db'}",
            "TURNOUT_ALERTMANAGER_CONFIG": str(bad),
            "TURNOUT_PORT": str(free_port()),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {bad}:3: receivers[0].rules: Input should be"), r.stderr


def _wait(what: str, check: Any, timeout_s: float = 45) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s")


@pytest.mark.skipif(
    not ALERTMANAGER.exists(),
    reason="no /usr/bin/prometheus-alertmanager (apt-get install prometheus-alertmanager)",
)
def test_a_real_alertmanager_pauses_a_ramp(
    db_url: str, tmp_path: Path, live: list[LiveService]
) -> None:
    skip_under_a_shifted_clock()
    tokens = make_tokens(db_url)
    svc = start_service(
        db_url,
        tmp_path / "svc.log",
        env={
            "TURNOUT_ALERTMANAGER_CONFIG": str(_config(tmp_path)),
            "TURNOUT_TEST_AM_BOT_TOKEN": BOT_TOKEN,
        },
    )
    live.append(svc)
    api = httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {tokens['operator']}"})
    version = api.get(f"/api/v1/canaries/{COHORT}").headers["ETag"]
    r = api.post(f"/api/v1/canaries/{COHORT}/ramp", json=RAMP, headers={"If-Match": version})
    assert r.status_code == 201, r.text
    ramp_id = r.json()["id"]

    port = free_port()
    (tmp_path / "alertmanager.yml").write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "route": {
                    "receiver": "turnout",
                    "group_by": ["alertname", "turnout_stage"],
                    "group_wait": "1s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {
                        "name": "turnout",
                        "webhook_configs": [
                            {
                                "url": f"{svc.url}/api/v1/alertmanager",
                                "send_resolved": True,
                                "max_alerts": 1000,
                                "http_config": {
                                    "authorization": {"type": "Bearer", "credentials": SRE_TOKEN}
                                },
                            }
                        ],
                    }
                ],
            }
        )
    )
    log = open(tmp_path / "alertmanager.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            str(ALERTMANAGER),
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    am_url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "alertmanager.log").read_text())
            try:
                return httpx.get(f"{am_url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("alertmanager ready", ready)
        fired = {
            "labels": {
                "alertname": "V2LatencyHigh",
                "severity": "page",
                "turnout_stage": COHORT,
            },
            "annotations": {"summary": "V2 TPOT p99 above V1's"},
            "generatorURL": GENERATOR,
            "startsAt": dt.datetime.now(dt.UTC).isoformat(),
        }
        r = httpx.post(f"{am_url}/api/v2/alerts", json=[fired], timeout=5)
        assert r.status_code == 200, r.text
        _wait(
            "the ramp paused",
            lambda: api.get(f"/api/v1/ramps/{ramp_id}").json()["state"] == "paused",
        )
        entry = next(e for e in api.get("/api/v1/audit").json() if e["action"] == "ramp.pause")
        assert entry["actor"] == "alertmanager:sre-pager"
        assert GENERATOR in entry["reason"] and "V2LatencyHigh" in entry["reason"]
        # resolved: Alertmanager sends it (send_resolved); the ramp stays paused
        resolved = {**fired, "endsAt": dt.datetime.now(dt.UTC).isoformat()}
        assert httpx.post(f"{am_url}/api/v2/alerts", json=[resolved], timeout=5).status_code == 200

        def resolved_receipt() -> bool:
            rows = api.get("/api/v1/alertmanager/receipts").json()
            return bool(rows) and rows[0]["resolved_at"] is not None

        _wait("the resolved notification", resolved_receipt)
        [receipt] = api.get("/api/v1/alertmanager/receipts").json()
        assert receipt["outcome"] == "acted" and receipt["generator_url"] == GENERATOR
        assert api.get(f"/api/v1/ramps/{ramp_id}").json()["state"] == "paused"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        api.close()


def test_receipts_keep_one_row_per_firing(am: Api) -> None:
    post(am, notification(alert("aa"), alert("aa", starts=STARTS + dt.timedelta(seconds=1))))
    with am.services.db.read_session() as s:
        assert s.query(AlertReceipt).count() == 2


def test_resolved_receipts_are_kept_30_days_and_firing_ones_until_they_resolve(am: Api) -> None:
    post(am, notification(alert("old"), alert("firing")))
    post(am, notification(alert("old", status="resolved")))
    # Counted from when the service received the resolution, not from Alertmanager's endsAt
    # (an endsAt 35 days back pruned the receipt at once, and a resend of the same firing
    # then acted a second time).
    resolved = dt.datetime.now(dt.UTC)
    late = alert("late", starts=STARTS - dt.timedelta(days=40))
    post(am, notification(late))
    post(am, notification({**late, "status": "resolved",
                           "endsAt": (STARTS - dt.timedelta(days=35)).isoformat()}))  # fmt: skip
    assert post(am, notification(late)).json()["outcomes"] == {"duplicate": 1}

    def fingerprints_after_a_delivery_at(now: dt.datetime) -> set[str]:
        with am.services.db.write_session() as session:
            alert_store.receive(session=session, receiver="sre-pager", alerts=[], now=now)
            session.commit()
        with am.services.db.read_session() as session:
            return {r.fingerprint for r in session.query(AlertReceipt)}

    assert fingerprints_after_a_delivery_at(resolved + dt.timedelta(days=29)) == {
        "old",
        "firing",
        "late",
    }
    assert fingerprints_after_a_delivery_at(resolved + dt.timedelta(days=31)) == {"firing"}
    # The firing one's key still tells a resend from a new firing.
    assert post(am, notification(alert("firing"))).json()["outcomes"] == {"duplicate": 1}


def test_the_docs_receivers_example_is_a_configuration_that_loads(tmp_path: Path) -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    section = doc[doc.index("## Alertmanager") :]
    example = re.findall(r"```yaml\n(.*?)```", section, re.S)[0]
    text = re.sub(r"token_sha256: \S+", f"token_sha256: {_sha(SRE_TOKEN)}", example)
    receivers = _load(tmp_path, text)
    sre = receivers.authenticate(SRE_TOKEN, "sre-pager")
    assert sre is not None
    assert [r.action for r in sre.rules] == ["kill_switch", "rollback", "pause"]
    broken = text.replace("action: rollback", "action: rollbak")  # the error the doc shows
    with pytest.raises(AlertConfigError, match=r":9: receivers\[0\]\.rules\[1\]\.action: Input"):
        _load(tmp_path, broken)
