"""The Overview shows each rollout stage's ramp beside its progress, in a real browser
(Playwright driving Debian's chromium) against a real service whose ticker runs: an active ramp
with its share, step and the time of its next step (and the gates it waits for), one paused
and one rolled back by a failing gate (named), one cancelled, and a stage without a ramp."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, make_tokens, start_service

pytestmark = needs_chromium
STEPS = [{"percentage": 10, "bake_s": 3600}, {"percentage": 50, "bake_s": 600}]
# stage → (the evidence of its families, what a failing gate does, what the test does after)
RAMPS = {
    "llama-mistral-dense": ({"llama": "pass", "mistral": "pass"}, "pause", None),
    "qwen3-canary": ({"qwen3": "fail"}, "pause", None),
    "granite-moe": ({"granite_moe": "fail"}, "rollback", None),
    "qwen-deepseek-moe": (
        {"qwen2_moe": "pass", "qwen3_moe": "pass", "deepseek_v2": "pass"},
        "pause",
        "cancel",
    ),
}
WANT_STATES = {
    "llama-mistral-dense": "active",
    "qwen3-canary": "paused",
    "granite-moe": "rolled_back",
    "qwen-deepseek-moe": "cancelled",
}


def _call(svc: LiveService, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    r = httpx.request(
        method,
        svc.url + path,
        headers={"Authorization": f"Bearer {token}", **kw.pop("headers", {})},
        **kw,
    )
    assert r.status_code < 300, r.text
    return r


def _ramps(svc: LiveService, token: str) -> dict[str, dict[str, Any]]:
    return {r["cohort"]: r for r in _call(svc, token, "GET", "/api/v1/ramps").json()}


def _start_ramps(svc: LiveService, op: str) -> None:
    for cohort, (evidence, on_failure, then) in RAMPS.items():
        for family, result in evidence.items():
            _call(
                svc,
                op,
                "POST",
                "/api/v1/evidence",
                json={"family": family, "suite": "tests/parity", "result": result},
            )
        etag = _call(svc, op, "GET", f"/api/v1/canaries/{cohort}").headers["ETag"]
        ramp = _call(
            svc,
            op,
            "POST",
            f"/api/v1/canaries/{cohort}/ramp",
            headers={"If-Match": etag},
            json={"steps": STEPS, "on_failure": on_failure, "reason": "overview test"},
        ).json()
        if then == "cancel":
            _call(
                svc,
                op,
                "POST",
                f"/api/v1/ramps/{ramp['id']}/cancel",
                json={"reason": "hold for the release"},
                headers={"If-Match": f'"{ramp["version"]}"'},
            )


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveService, dict[str, str], dict[str, dict[str, Any]]]]:
    root = tmp_path_factory.mktemp("overview-ramps")
    url = f"sqlite:///{root / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, root / "svc.log", env={"TURNOUT_TICK_S": "0.2"})
    _start_ramps(svc, tokens["operator"])
    for _ in range(300):  # the ticker (every 0.2 s) reads the gates and acts on them
        ramps = _ramps(svc, tokens["viewer"])
        if {c: r["state"] for c, r in ramps.items()} == WANT_STATES and ramps[
            "llama-mistral-dense"
        ]["last_gates"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the ticker did not act on the ramps: {ramps}")
    yield svc, tokens, ramps
    svc.stop()


def _cell(page: Any, cohort: str) -> str:
    return str(page.inner_text(f"#ramp-state-{cohort}"))


def test_the_overview_shows_each_stages_ramp_beside_its_progress(browser: Any, site: tuple) -> None:
    svc, tokens, ramps = site
    page, problems = signed_in(browser, svc, tokens["viewer"])
    assert page.url == svc.url + "/"
    nxt = dt.datetime.fromisoformat(ramps["llama-mistral-dense"]["next_step_at"])
    active = _cell(page, "llama-mistral-dense")
    assert active.startswith(
        f"active · 10% (step 1/2)\nnext step {nxt:%Y-%m-%d %H:%M} UTC once health_engines"
    )
    assert _cell(page, "qwen3-canary") == ("paused · 10% (step 1/2)\ngate parity_evidence failed")
    ended = dt.datetime.fromisoformat(ramps["granite-moe"]["ended_at"])
    assert _cell(page, "granite-moe") == (
        f"rolled back at 10% (step 1/2)\ngate parity_evidence failed · {ended:%Y-%m-%d %H:%M} UTC"
    )
    cancelled = dt.datetime.fromisoformat(ramps["qwen-deepseek-moe"]["ended_at"])
    assert _cell(page, "qwen-deepseek-moe") == (
        f"cancelled at 10% (step 1/2)\n{cancelled:%Y-%m-%d %H:%M} UTC"
    )
    assert _cell(page, "pooling") == "—"
    # a live ramp links to its gates on the Canaries page
    page.click("#ramp-state-qwen3-canary a")
    page.wait_for_url(svc.url + "/canaries#ramp-qwen3-canary")
    assert page.locator("#ramp-qwen3-canary table.gates").count() == 1
    assert problems == []
