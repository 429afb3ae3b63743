"""A deployment's page shows how ``turnout launch`` started vLLM and what vLLM said at start-up,
in a real browser (Playwright driving Debian's chromium) against a real service: the variable
launch set and vLLM's line, with the agreement said; a line naming another runner than the
decision is flagged on the page and in the history; a start in exec mode says no line came."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, make_tokens, start_service

from turnout.dashboard.deployments import deployment_url

pytestmark = needs_chromium
AT = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=5)
V1_LINE = "INFO 12-01 10:00:02 [gpu_model_runner.py:2034] Starting to load model Qwen/Qwen3-8B..."
V2_LINE = "INFO 12-01 10:00:02 [gpu_worker.py:101] Using V2 Model Runner"


def _event(
    event_id: str, deployment: str, *, startup: dict[str, str] | None = None, at: dt.datetime = AT
) -> dict[str, Any]:
    launch: dict[str, Any] = {
        "vllm_version": "0.31.0",
        "vllm_pack": "vllm-0.31",
        "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
        "snapshot_source": "service",
    }
    if startup is not None:
        launch["startup"] = startup
    return {
        "event_id": event_id,
        "at": at.isoformat(),
        "deployment_id": deployment,
        "host": "gpu-7",
        "pack": "turnout",
        "family": "qwen3",
        "runner": "v1",
        "mode": "auto",
        "stage": "qwen3-canary",
        "reason_code": "DISABLED",
        "rule_ids": ["rollout.stage_off"],
        "launch": launch,
        "config": {"architecture": "Qwen3ForCausalLM", "model": "Qwen/Qwen3-8B"},
    }


def _follow_up(event_id: str, deployment: str, runner: str, line: str) -> dict[str, Any]:
    return _event(
        f"{event_id}.startup",
        deployment,
        at=AT + dt.timedelta(seconds=30),
        startup={"runner": runner, "line": line},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, str]]]:
    root = tmp_path_factory.mktemp("launch-page")
    url = f"sqlite:///{root / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, root / "svc.log")
    batches = [
        [_event("e-agree", "prod/agree")],
        [_follow_up("e-agree", "prod/agree", "v1", V1_LINE)],
        [_event("e-differ", "prod/differ"), _follow_up("e-differ", "prod/differ", "v2", V2_LINE)],
        [_event("e-exec", "prod/exec")],
    ]
    for events in batches:
        r = httpx.post(
            f"{svc.url}/api/v1/decisions",
            json={"events": events},
            headers={"Authorization": f"Bearer {tokens['operator']}"},
        )
        r.raise_for_status()
    yield svc, tokens
    svc.stop()


def test_the_page_says_what_launch_set_and_what_vllm_said(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + deployment_url("prod/agree"))
    launched = page.inner_text("#launched")
    assert launched.startswith(
        f"launched vLLM 0.31.0 with VLLM_USE_V2_MODEL_RUNNER=0; vLLM said: {V1_LINE}"
    )
    assert page.inner_text("#startup-agrees") == "— V1, as turnout decided"
    assert "canaries from the service's canary snapshot" in page.inner_text("#launch")
    assert page.locator("#startup-mismatch, #startup-differs").count() == 0
    # One start, one decision: the follow-up is no second row of the history.
    assert page.locator("#history tbody tr").count() == 1
    assert problems == []


def test_a_line_naming_another_runner_is_flagged(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + deployment_url("prod/differ"))
    assert page.inner_text("#startup-mismatch").startswith(
        "vLLM says it runs V2, but turnout decided V1 for this start"
    )
    assert page.inner_text("#startup-differs") == "— vLLM runs V2, turnout decided V1"
    assert page.inner_text("#history tbody tr td:nth-child(3)") == "v1 vLLM: V2"
    page.goto(svc.url + "/decisions")
    row = page.locator("#decisions tbody tr", has_text="prod/differ")
    assert row.locator("span.mismatch").inner_text() == "vLLM: V2"
    assert page.locator("#decisions span.mismatch").count() == 1
    assert problems == []


def test_a_start_in_exec_mode_says_no_line_came(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + deployment_url("prod/exec"))
    assert page.inner_text("#launched") == (
        "launched vLLM 0.31.0 with VLLM_USE_V2_MODEL_RUNNER=0; vLLM's start-up line was not "
        "reported (turnout launch --report-startup reports it)"
    )
    assert problems == []
