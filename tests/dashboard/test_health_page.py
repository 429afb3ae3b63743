"""The Engine health page in a real browser and service: V1 against V2 of one stage, the
numbers the API gives, a chart per measure drawn over time, the filters applied on change,
"No data yet" for a stage no engine reported in, and a bad filter said in words."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, make_tokens, start_service

pytestmark = needs_chromium
STAGE = "llama-mistral-dense"
NOW = dt.datetime.now(dt.UTC)
CHARTS = ["chart-tpot_p99_ms", "chart-ttft_p99_ms", "chart-error_rate", "chart-tokens_per_s"]


def _report(runner: str, hours_ago: float, engine: int, **over: Any) -> dict[str, Any]:
    end = NOW - dt.timedelta(hours=hours_ago)
    slower = 1.3 if runner == "v2" else 1.0
    return {
        "report_id": uuid.uuid4().hex,
        "deployment_id": f"{runner}-{engine}",
        "host": "h",
        "pack": "turnout",
        "runner": runner,
        "family": "llama",
        "stage": STAGE,
        "window_start": (end - dt.timedelta(minutes=1)).isoformat(),
        "window_end": end.isoformat(),
        "num_requests": 100,
        "num_errors": engine % 2,
        "num_crashes": 0,
        "ttft_p50_ms": 20.0,
        "ttft_p99_ms": 60.0 * slower,
        "tpot_p50_ms": 5.0,
        "tpot_p99_ms": 9.0 * slower,
        "num_output_tokens": 12_000,
        "output_tokens_per_s": 400.0 / slower,
    } | over


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, str]]]:
    root = tmp_path_factory.mktemp("health-page")
    url = f"sqlite:///{root / 'health.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, root / "svc.log")
    reports = [
        _report(r, h, e)
        for r in ("v1", "v2")
        for h in (0.2, 3, 9, 20)
        for e in range(3 if r == "v1" else 2)
    ]
    reports.append(_report("v2", 1, 9, num_crashes=1))
    r = httpx.post(
        f"{svc.url}/api/v1/health",
        json={"reports": reports},
        headers={"Authorization": f"Bearer {tokens['operator']}"},
    )
    assert r.status_code == 200 and r.json()["accepted"] == len(reports), r.text
    yield svc, tokens
    svc.stop()


def _api(svc: LiveService, token: str) -> dict[str, Any]:
    r = httpx.get(
        f"{svc.url}/api/v1/health?stage={STAGE}", headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_v1_and_v2_side_by_side_with_the_apis_numbers(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["viewer"], http_errors=True)
    page.click("nav a[href='/health']")
    page.wait_for_load_state("networkidle")
    assert page.inner_text("h1") == "Engine health"
    # No stage asked for: the one that reported last.
    assert page.locator("select[name=stage]").input_value() == STAGE
    api = _api(svc, tokens["viewer"])["by_runner"]
    assert page.inner_text("#engines-v1") == str(api["v1"]["num_engines"]) == "3"
    assert page.inner_text("#engines-v2") == str(api["v2"]["num_engines"]) == "3"
    rows = {
        r.locator("th").inner_text(): [c.inner_text() for c in r.locator("td").all()]
        for r in page.locator("#health-summary tbody tr").all()
    }
    assert rows["requests"] == [f"{api['v1']['num_requests']:,}", f"{api['v2']['num_requests']:,}"]
    assert rows["crashes"] == ["0", "1"]
    assert rows["TPOT p99 (ms)"] == [
        f"{api['v1']['tpot_p99_ms']:.2f}",
        f"{api['v2']['tpot_p99_ms']:.2f}",
    ]
    drawn = page.evaluate(
        "ids => ids.map(id => { const c = window.Chart.getChart("
        "document.getElementById(id)); return c ? c.data.datasets.map("
        "d => d.label) : null; })",
        CHARTS,
    )
    assert drawn == [["V1", "V2"]] * 4
    assert problems == []


def test_the_filters_apply_on_change(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["viewer"], http_errors=True)
    page.goto(svc.url + "/health")
    with page.expect_navigation():
        page.select_option("select[name=window]", "1h")
    assert "window=1h" in page.url
    # In the last hour only the 0.2-hour-old reports: 3 V1 engines, 2 V2 ones.
    assert (page.inner_text("#engines-v1"), page.inner_text("#engines-v2")) == ("3", "2")
    with page.expect_navigation():
        page.select_option("select[name=stage]", "pooling")
    assert "stage=pooling" in page.url
    assert "No data yet" in page.inner_text("#no-data")
    assert page.locator("canvas").count() == 0
    assert problems == []


def test_a_family_the_pack_does_not_have_is_said_in_words(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["viewer"])
    response = page.goto(svc.url + f"/health?stage={STAGE}&family=Llama")
    assert response.status == 422
    assert "did you mean 'llama'" in page.inner_text("#error")
    assert [p for p in problems if "422" not in p] == []


def test_a_measure_no_report_has_says_no_data_yet(browser: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'idle.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log")
    try:
        idle = _report(
            "v1",
            0.1,
            0,
            num_requests=0,
            num_errors=0,
            ttft_p50_ms=None,
            ttft_p99_ms=None,
            tpot_p50_ms=None,
            tpot_p99_ms=None,
            num_output_tokens=0,
            output_tokens_per_s=0.0,
        )
        httpx.post(
            f"{svc.url}/api/v1/health",
            json={"reports": [idle]},
            headers={"Authorization": f"Bearer {tokens['operator']}"},
        ).raise_for_status()
        page, problems = signed_in(browser, svc, tokens["viewer"])
        page.goto(svc.url + "/health")
        page.wait_for_load_state("networkidle")
        assert page.inner_text("#engines-v1") == "1"  # an idle engine still reports
        # No finished request, no token: no latency, no error rate, no rate to draw.
        notes = page.locator(".charts .no-data").all_inner_texts()
        assert len(notes) == 4 and all(n.startswith("No data yet") for n in notes)
        assert problems == []
    finally:
        svc.stop()
