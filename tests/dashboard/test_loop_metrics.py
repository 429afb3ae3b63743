"""The closed loop's counters on ``/metrics``, in-process on SQLite and PostgreSQL: the ramp
ticker's passes (``background.tick``, at chosen times, over real health reports) count the steps
it takes, each failing gate by name, and the pause or the rollback it led to; the delivery
worker's passes (``background.deliver``) count deliveries to a real local receiver, failed
attempts to a port nothing listens on, and the delivery that gave up."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from service_helpers import Api, free_port, role_tokens
from webhook_receiver import Receiver

from turnout.dashboard import background

COHORT = "llama-mistral-dense"  # off by default; families llama and mistral
SECRET = "whsec_loop_metrics_0123456789"
STEPS = [
    {"percentage": 10, "bake_s": 60},
    {"percentage": 50, "bake_s": 60},
    {"percentage": 100, "bake_s": 60},
]


@pytest.fixture
def loop(db_url: str) -> Iterator[Api]:
    from fastapi.testclient import TestClient

    from turnout.dashboard.app import create_app
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings

    services = Services.build(
        Settings(
            database_url=db_url,
            demo=False,
            snapshot_ttl_s=0,
            background=False,
            ramp_gates={"min_engines": 1},
            webhook_max_attempts=2,
            webhook_backoff_s=1,
            webhook_allow_networks="127.0.0.0/8",  # the receivers here are local
        )
    )
    with TestClient(create_app(services=services)) as client:
        yield Api(client, services, role_tokens(services.db))


def _samples(api: Api, name: str) -> dict[str, float]:
    """``{labels: value}`` of a metric's samples on /metrics (labels as written, "" for none)."""
    text = api.client.get("/metrics").text
    found = re.findall(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, flags=re.M)
    return {labels: float(value) for labels, value in found}


def _post(
    api: Api, path: str, body: Any, role: str = "operator", headers: dict[str, str] | None = None
) -> Any:
    r = api.client.post(path, json=body, headers={**api.h(role), **(headers or {})})
    assert r.status_code in (200, 201), r.text
    return r.json()


def _health(api: Api, runner: str, end: dt.datetime, *, crashes: int = 0) -> None:
    reports = [
        {
            "report_id": uuid.uuid4().hex,
            "deployment_id": f"{runner}-{end:%H%M%S}",
            "pack": "turnout",
            "runner": runner,
            "family": "llama",
            "stage": COHORT,
            "window_start": (end - dt.timedelta(seconds=20)).isoformat(),
            "window_end": end.isoformat(),
            "num_requests": 100,
            "num_errors": 0,
            "num_crashes": crashes,
            "ttft_p50_ms": 10.0,
            "ttft_p99_ms": 20.0,
            "tpot_p50_ms": 5.0,
            "tpot_p99_ms": 8.0,
        }
    ]
    assert _post(api, "/api/v1/health", {"reports": reports})["rejected"] == []


def _ramp(api: Api, on_failure: str) -> dt.datetime:
    """Parity evidence for the stage's families, then a ramp; returns when it started."""
    for family in ("llama", "mistral"):
        _post(
            api, "/api/v1/evidence", {"family": family, "suite": "tests/parity", "result": "pass"}
        )
    version = api.client.get(f"/api/v1/canaries/{COHORT}", headers=api.h("viewer")).headers["ETag"]
    ramp = _post(
        api,
        f"/api/v1/canaries/{COHORT}/ramp",
        {"steps": STEPS, "on_failure": on_failure, "reason": "parity green"},
        headers={"If-Match": version},
    )
    return dt.datetime.fromisoformat(ramp["started_at"])


@pytest.mark.parametrize("on_failure", ["pause", "rollback"])
def test_ramp_steps_gate_failures_and_what_they_led_to_are_counted(
    loop: Api, on_failure: str
) -> None:
    t0 = _ramp(loop, on_failure)
    _health(loop, "v1", t0 + dt.timedelta(seconds=30))
    _health(loop, "v2", t0 + dt.timedelta(seconds=30))
    [tick] = background.tick(loop.services, t0 + dt.timedelta(seconds=70)).ramps
    assert tick.outcome == "stepped"
    assert _samples(loop, "turnout_ramp_steps_total") == {f'{{cohort="{COHORT}"}}': 1.0}
    _health(loop, "v2", t0 + dt.timedelta(seconds=100), crashes=1)  # V2 crashes
    [tick] = background.tick(loop.services, t0 + dt.timedelta(seconds=110)).ramps
    assert tick.outcome == ("paused" if on_failure == "pause" else "rolled_back")
    assert _samples(loop, "turnout_ramp_gate_failures_total") == {
        f'{{cohort="{COHORT}",gate="v2_crash_rate"}}': 1.0
    }
    pauses = _samples(loop, "turnout_ramp_pauses_total")
    rollbacks = _samples(loop, "turnout_ramp_rollbacks_total")
    counted = {f'{{cohort="{COHORT}"}}': 1.0}
    assert (pauses, rollbacks) == ((counted, {}) if on_failure == "pause" else ({}, counted))
    # The ramp is no longer active: a later pass counts nothing more.
    assert background.tick(loop.services, t0 + dt.timedelta(seconds=200)).ramps == []
    assert _samples(loop, "turnout_ramp_steps_total") == {f'{{cohort="{COHORT}"}}': 1.0}


def test_webhook_deliveries_failed_attempts_and_dead_ones_are_counted(loop: Api) -> None:
    receiver = Receiver(SECRET, tolerance_s=2 * 86_400).start()
    try:
        for url in (receiver.url, f"http://127.0.0.1:{free_port()}/hook"):  # up, down
            _post(
                loop,
                "/api/v1/webhooks",
                {"url": url, "kinds": ["kill_switch"], "secret": SECRET},
                role="admin",
            )
        _post(loop, "/api/v1/kill-switch", {"engaged": True, "reason": "V2 crash loop"})
        assert _samples(loop, "turnout_webhook_deliveries_total") == {
            '{outcome="delivered"}': 0.0,
            '{outcome="dead"}': 0.0,
        }
        now = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
        report = background.deliver(loop.services, now)
        assert (len(report.delivered), len(report.retried)) == (1, 1)
        assert _samples(loop, "turnout_webhook_failed_attempts_total") == {"": 1.0}
        report = background.deliver(loop.services, now + dt.timedelta(hours=1))
        assert len(report.dead) == 1  # its second attempt, the last
        assert _samples(loop, "turnout_webhook_deliveries_total") == {
            '{outcome="delivered"}': 1.0,
            '{outcome="dead"}': 1.0,
        }
        assert _samples(loop, "turnout_webhook_failed_attempts_total") == {"": 2.0}
        assert len(receiver.deliveries) == 1 and receiver.deliveries[0].signed
    finally:
        receiver.stop()
