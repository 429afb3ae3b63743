"""The pages in a real browser (Playwright driving Debian's chromium): every page opens without
console errors, an operator flips a canary through the UI with a reason and finds the audit
entry, a viewer sees no action buttons, and the fallback-reasons page is saved as a screenshot
under docs/; the upgrade preview shows what the demo fleet would do under another vLLM
release."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, make_tokens, start_service

# Each run saves the page here (git-ignored, so a test run leaves no tracked file changed);
# the images docs/service.md shows come from scripts/screenshots.py.
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "fallback-reasons.latest.png"
UPGRADE_SCREENSHOT = SCREENSHOT.with_name("upgrade-preview.latest.png")
PAGES = {
    "/": "Overview",
    "/fallbacks": "Fallback reasons",
    "/canaries": "Canaries",
    "/health": "Engine health",
    "/decisions": "Decisions",
    "/matrix": "Matrix",
    "/explain": "Explain",
    "/upgrade": "Upgrade vLLM",
    "/audit": "Audit log",
    "/deployments/demo%2Frecipe-0008": "Deployment",
}

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, str]]]:
    root = tmp_path_factory.mktemp("pages")
    url = f"sqlite:///{root / 'pages.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, root / "svc.log", demo=True)
    yield svc, tokens
    svc.stop()


def _signed_in(browser: object, svc: LiveService, token: str) -> tuple[object, list[str]]:
    return signed_in(browser, svc, token, from_root=True, http_errors=True)


def test_every_page_opens_without_console_errors(browser: object, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    for path, heading in PAGES.items():
        page.goto(svc.url + path)
        page.wait_for_load_state("networkidle")
        assert page.inner_text("h1").startswith(heading), path
    assert problems == []


def test_charts_are_drawn_from_the_demo_fleet(browser: object, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/fallbacks")
    page.wait_for_load_state("networkidle")
    # Chart.js registers a chart instance per canvas it drew.
    drawn = page.evaluate(
        "['blocked-family', 'blocked-time'].map(id => "
        "!!window.Chart.getChart(document.getElementById(id)))"
    )
    assert drawn == [True, True]
    assert page.locator("#ranked tbody tr").count() > 1
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert problems == []


def test_operator_flips_a_canary_with_a_reason_and_sees_the_audit_entry(
    browser: object, site: tuple
) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["operator"])
    page.goto(svc.url + "/canaries")
    rows = page.locator("tbody tr[id^=cohort-]")
    # A stage that is off, so that enabling it at a share is what the page does.
    row = next(
        (
            rows.nth(i)
            for i in range(rows.count())
            if rows.nth(i).locator("td.state").inner_text() == "off"
        ),
        rows.first,
    )
    cohort = row.get_attribute("id").removeprefix("cohort-")
    was_on = row.locator("td.state").inner_text() != "off"
    row.locator("button.toggle").click()
    confirm = page.locator(f"#confirm-{cohort} form.confirm")
    confirm.wait_for()
    assert "recorded deployments would change runner" in confirm.inner_text()
    reason = f"parity suite green for {cohort} (page test)"
    if not was_on:
        confirm.locator("input[name=percentage]").fill("25")
    confirm.locator("input[name=reason]").fill(reason)
    confirm.locator("button[type=submit]").click()
    page.wait_for_selector("#message")
    assert reason in page.inner_text("#message")
    state = page.locator(f"#cohort-{cohort} td.state").inner_text()
    assert state == ("off" if was_on else "on 25%")
    page.goto(svc.url + "/audit")
    first = page.locator("#audit tbody tr").first.inner_text()
    assert reason in first and f"cohort:{cohort}" in first and "canary.flip" in first
    assert problems == []


def test_viewer_sees_no_action_buttons(browser: object, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/canaries")
    assert page.locator("tbody tr[id^=cohort-]").count() > 0
    assert page.locator("button.toggle").count() == 0
    assert page.locator("form[action='/kill-switch']").count() == 0
    assert problems == []


def test_explain_form_shows_the_decision_for_a_pasted_command(browser: object, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/explain")
    page.fill(
        "textarea[name=command]",
        "vllm serve Qwen/Qwen3-8B --speculative-config.method ngram "
        "--speculative-config.num_speculative_tokens 3",
    )
    page.click("form#explain button[type=submit]")
    page.wait_for_selector("#decision")
    text = page.inner_text("#decision")
    assert "runner" in text.lower()
    assert problems == []


def test_api_browser_loads_from_vendored_assets(browser: object, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    outside: list[str] = []
    page.on(
        "request",
        lambda r: outside.append(r.url) if not r.url.startswith((svc.url, "data:")) else None,
    )
    page.goto(svc.url + "/api/v1/docs")
    page.wait_for_selector(".swagger-ui .opblock")
    assert page.locator(".opblock-summary-path[data-path='/api/v1/decide']").count() == 1
    assert outside == [] and problems == []


def test_reasons_of_a_stage_enabled_since_are_marked_on_both_pages(
    browser: object, site: tuple
) -> None:
    import httpx

    svc, tokens = site
    auth = {"Authorization": f"Bearer {tokens['operator']}"}
    ranked = httpx.get(svc.url + "/api/v1/fallbacks", headers=auth).json()["ranked"]
    # A stage still off (another test may have turned one on): not marked yet.
    key, num = next(
        (r["key"], r["deployments"])
        for r in ranked
        if r["key"].startswith("rollout.stage_off:") and r["stage_enabled_since"] is None
    )
    cohort = key.split(":", 1)[1]
    url = f"{svc.url}/api/v1/canaries/{cohort}"

    def flip(enabled: bool) -> None:
        etag = httpx.get(url, headers=auth).headers["ETag"]
        r = httpx.patch(
            url,
            headers={**auth, "If-Match": etag},
            json={"enabled": enabled, "percentage": 100, "reason": "page test"},
        )
        assert r.status_code == 200, r.text

    flip(True)
    try:
        since = httpx.get(url, headers=auth).json()["updated_at"]
        after = httpx.get(svc.url + "/api/v1/fallbacks", headers=auth).json()["ranked"]
        # The recorded decisions are kept as the engines reported them, and marked.
        (row,) = [r for r in after if r["key"] == key]
        assert row["deployments"] == num and row["stage_enabled_since"] == since
        page, problems = _signed_in(browser, svc, tokens["viewer"])
        page.goto(svc.url + "/fallbacks")
        cell = page.locator("#ranked tbody tr", has=page.locator(f"code:text-is('{key}')"))
        note = cell.locator(".stage-on").inner_text()
        assert note.startswith(f"stage enabled since {since[:10]} {since[11:16]} UTC")
        assert note.endswith("decide V2 at their next start and report")
        page.goto(svc.url + "/")
        stage = page.locator("tr", has=page.locator(f"code:text-is('{cohort}')"))
        assert (
            stage.locator(".stage-on")
            .inner_text()
            .endswith(
                f"{num} deployment{'s' if num != 1 else ''} decided before: V2 at their next "
                "start and report"
            )
        )
        assert problems == []
    finally:
        flip(False)


def test_upgrade_preview_shows_per_family_what_would_switch_and_why(
    browser: object, site: tuple
) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/upgrade")
    assert page.locator("select[name=from]").input_value() == "vllm-0.32"  # the defaults
    assert page.locator("select[name=to]").input_value() == "vllm-0.33"
    page.select_option("select[name=from]", "vllm-0.30")
    page.select_option("select[name=to]", "vllm-0.31")
    page.click("form#upgrade-form button[type=submit]")
    page.wait_for_url("**/upgrade?from=vllm-0.30&to=vllm-0.31")
    # vLLM 0.31 runs custom logits processors on V2: the demo's DeepSeek-OCR recipes switch.
    row = page.locator("#families tr[data-family=deepseek_vl]")
    assert row.locator("td").nth(2).inner_text() == "2"
    assert "custom_logits_processors (2)" in row.inner_text()
    assert int(page.inner_text("#num-changed")) >= 2
    details = page.locator("#switch-deepseek_vl")
    details.locator("summary").click()
    text = details.locator("table").inner_text()
    assert "demo/recipe-0008" in text and "v1→v2" in text and "DEFAULT" in text
    page.screenshot(path=str(UPGRADE_SCREENSHOT), full_page=True)
    assert problems == []


def test_upgrade_preview_of_an_unknown_pack_is_a_422_page_that_names_the_packs(
    browser: object, site: tuple
) -> None:
    svc, tokens = site
    page, _problems = _signed_in(browser, svc, tokens["viewer"])
    response = page.goto(svc.url + "/upgrade?from=vllm-0.3&to=vllm-0.33")
    assert response is not None and response.status == 422
    error = page.inner_text("#error")
    assert "from: unknown pack 'vllm-0.3'" in error and "vllm-0.29" in error
    assert page.locator("#families").count() == 0
