"""What an operator on call reads, in a real browser (Playwright driving Debian's chromium) on
the demo fleet: the confirm form's impact preview follows the share typed in and warns of
failing parity evidence; Decisions counts, pages, filters by a time window and exports the
same rows as CSV; every deployment id links to its page (model, inputs, command line,
history, Explain); the Matrix grid has a legend and cell detail by click and keyboard; the
kill switch shows on every canary row it overrides; an empty fleet's charts say so."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, make_tokens, start_service

OFF_STAGE = "llama-mistral-dense"  # off by default; its llama and mistral deployments wait

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, str]]]:
    root = tmp_path_factory.mktemp("operator")
    url = f"sqlite:///{root / 'pages.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, root / "svc.log", demo=True)
    yield svc, tokens
    svc.stop()


_signed_in = signed_in


def _api(svc: LiveService, token: str, path: str, **params: Any) -> Any:
    r = httpx.get(svc.url + path, params=params, headers={"Authorization": f"Bearer {token}"})
    r.raise_for_status()
    return r.json()


def _impact_words(text: str) -> tuple[int, int]:
    m = re.search(r"(\d+) of (\d+) recorded deployments would change runner", text)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def test_confirm_preview_follows_the_share_typed_in(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["operator"])
    page.goto(svc.url + "/canaries")
    page.locator(f"#cohort-{OFF_STAGE} button.toggle").click()
    form = page.locator(f"#confirm-{OFF_STAGE} form.confirm")
    form.wait_for()
    line = page.locator(f"#impact-{OFF_STAGE}")
    seen = {}
    for share in (100, 10, 0, 60):
        form.locator("input[name=percentage]").fill(str(share))
        page.wait_for_selector(f"#impact-{OFF_STAGE} [data-share='{share}']")
        api = _api(
            svc,
            tokens["viewer"],
            "/api/v1/impact",
            cohort=OFF_STAGE,
            enabled="true",
            percentage=share,
        )
        assert f"Impact at {share}%" in line.inner_text()
        seen[share] = _impact_words(line.inner_text())
        assert seen[share] == (api["num_changed"], api["num_considered"]), share
    assert seen[0][0] == 0 and seen[10][0] < seen[100][0]  # the share matters
    form.locator("input[name=percentage]").fill("150")
    page.wait_for_selector(f"#impact-{OFF_STAGE} [data-impact=bad]")
    assert "give a whole number from 0 to 100" in line.inner_text()
    # the browser logs the fragment's 422 (the answer for a share out of range), nothing else
    assert problems == [
        "console error: Failed to load resource: the server responded with a "
        "status of 422 (Unprocessable Entity)"
    ]


def test_enabling_a_stage_whose_parity_evidence_fails_warns(browser: Any, site: tuple) -> None:
    svc, tokens = site
    auth = {"Authorization": f"Bearer {tokens['operator']}"}
    for family, result in (("llama", "fail"), ("mistral", "pass"), ("qwen3", "pass")):
        r = httpx.post(
            svc.url + "/api/v1/evidence",
            headers=auth,
            json={"family": family, "suite": "tests/parity", "result": result},
        )
        assert r.status_code == 201, r.text
    page, problems = _signed_in(browser, svc, tokens["operator"])
    page.goto(svc.url + "/canaries")
    assert "llama fail" in page.inner_text(f"#cohort-{OFF_STAGE} td.evidence")
    page.locator(f"#cohort-{OFF_STAGE} button.toggle").click()
    warning = page.locator(f"#evidence-warning-{OFF_STAGE}")
    warning.wait_for()
    text = warning.inner_text()
    assert text.startswith("Parity evidence reads fail for llama (tests/parity, v1:v2, ")
    assert "mistral" not in text  # its latest run passed
    page.locator("#cohort-qwen3-canary button.toggle").click()  # disabling: nothing to warn of
    page.locator("#confirm-qwen3-canary form.confirm").wait_for()
    assert page.locator("#confirm-qwen3-canary .warning").count() == 0
    assert problems == []


def test_the_kill_switch_overrides_every_canary_row(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["admin"])
    page.goto(svc.url + "/canaries")
    row = page.locator("#cohort-qwen3-canary")
    assert row.locator("td.state").inner_text() == "on 100%"
    assert row.locator("td.families").inner_text().startswith("qwen3\nwhen not quantized")
    quantized = page.locator("#cohort-quantized td.families").inner_text()
    assert quantized.startswith("any family\nwhen quantized\nin the fleet: ")
    form = page.locator("form[action='/kill-switch']")
    form.locator("input[name=reason]").fill("V2 crash loop (page test)")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("#message")
    try:
        state = page.locator("#cohort-qwen3-canary td.state").inner_text()
        assert state.startswith("kill switch: V1") and "on 100%" in state
        assert "applies once the kill switch is released" in state
        off = page.locator(f"#cohort-{OFF_STAGE} td.state").inner_text()
        assert off == "off"  # an off canary reads off either way
        page.goto(svc.url + "/")
        stage = page.locator("tr", has=page.locator("code:text-is('qwen3-canary')"))
        assert stage.locator("td").nth(2).inner_text().startswith("kill switch: V1")
    finally:
        r = httpx.post(
            svc.url + "/api/v1/kill-switch",
            headers={"Authorization": f"Bearer {tokens['admin']}"},
            json={"engaged": False, "reason": "page test done"},
        )
        assert r.status_code == 200, r.text
    assert problems == []


def test_decisions_are_counted_paged_in_a_stable_order_and_exported(
    browser: Any, site: tuple
) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/decisions?size=25")
    total = int(page.inner_text("#decisions-count").split()[0])
    assert total > 100
    first = page.locator("#decisions tbody tr").all_inner_texts()
    assert len(first) == 25 and page.inner_text("#pager .count") == f"1\u201325 of {total}"
    page.locator("#pager a[rel=next]").click()
    page.wait_for_url("**after=**")
    second = page.locator("#decisions tbody tr").all_inner_texts()
    assert page.inner_text("#pager .count") == f"26\u201350 of {total}"
    assert not set(first) & set(second)
    page.locator("#pager a[rel=prev]").click()
    page.wait_for_url("**before=**")
    assert page.locator("#decisions tbody tr").all_inner_texts() == first
    # The export holds the rows of the same filters, in the same order.
    with page.expect_download() as download:
        page.click("#export-csv")
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows[0][:3] == ["at", "event_id", "deployment_id"] and len(rows) == total + 1
    assert [r[2] for r in rows[1:26]] == [t.split("\t")[1].split()[0] for t in first]
    assert problems == []


def test_the_time_window_control_narrows_the_count(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/decisions")
    everything = int(page.inner_text("#decisions-count").split()[0])
    page.fill("input[name=from]", "2020-01-01T00:00")  # typed first, then a preset picked
    page.check("input[name=window][value='24h']")
    page.click("#decision-filters button[type=submit]")
    page.wait_for_url("**window=24h**")
    assert "from=" not in page.url  # the preset wins: the range is not sent
    day = int(page.inner_text("#decisions-count").split()[0])
    assert 0 < day < everything and "in the last 24 hours" in page.inner_text("h1")
    page.fill("input[name=from]", "2020-01-01T00:00")
    page.fill("input[name=to]", "2020-01-02T00:00")
    page.click("#decision-filters button[type=submit]")
    page.wait_for_url("**window=custom**")
    assert page.inner_text("#decisions-count").startswith("0 matching from 2020-01-01 00:00 UTC")
    csv_link = page.get_attribute("#export-csv", "href")
    assert "window=custom" in csv_link and "from=2020-01-01T00%3A00" in csv_link
    assert problems == []
    response = page.goto(svc.url + "/decisions?window=custom&from=2020-02-01&to=2020-01-01")
    assert response is not None and response.status == 422
    assert "must be before to" in page.inner_text("#window-error")


def test_a_deployment_page_shows_model_command_history_and_explains_it(
    browser: Any, site: tuple
) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/decisions?family=deepseek_vl")
    link = page.locator("#decisions a.deployment", has_text="demo/recipe-0008").first
    assert link.get_attribute("href") == "/deployments/demo%2Frecipe-0008"
    link.click()
    page.wait_for_url("**/deployments/demo%2Frecipe-0008")
    assert page.inner_text("#model") == "deepseek-ai/DeepSeek-OCR"
    command = page.inner_text("#command-line")
    assert (
        " decide --pack turnout --deployment-id demo/recipe-0008 --architecture "
        "DeepseekOCRForCausalLM "
        in command
        and "--set model=deepseek-ai/DeepSeek-OCR" in command
    )
    history = _api(svc, tokens["viewer"], "/api/v1/decisions", deployment_id="demo/recipe-0008")
    assert page.locator("#history tbody tr").count() == len(history) >= 1
    now = page.inner_text("#decision-now")
    page.click("#explain-link")
    page.wait_for_selector("#decision")
    assert page.locator("textarea[name=config]").input_value().startswith('{"architecture": ')
    runner = now.split()[1]  # "runner NONE (ERROR)"
    assert page.inner_text("#decision h2") == f"Decision: runner {runner}"
    # and from the upgrade preview, where the same id is listed
    page.goto(svc.url + "/upgrade?from=vllm-0.30&to=vllm-0.31")
    page.locator("#switch-deepseek_vl summary").click()
    assert (
        page.locator("#switch-deepseek_vl a.deployment", has_text="demo/recipe-0008").get_attribute(
            "href"
        )
        == "/deployments/demo%2Frecipe-0008"
    )
    assert problems == []
    response = page.goto(svc.url + "/deployments/no%2Fsuch")
    assert response is not None and response.status == 404
    assert "no decision of a deployment 'no/such' is recorded" in page.inner_text("#error")


def test_matrix_has_a_legend_and_cell_detail_by_click_and_keyboard(
    browser: Any, site: tuple
) -> None:
    svc, tokens = site
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/matrix")
    legend = page.inner_text("#matrix-legend")
    assert "share (%) of the family's architectures that get V2" in legend
    assert page.locator("#matrix-legend .swatch").count() == 5
    row = page.locator("#matrix tbody tr", has=page.locator("th", has_text="qwen3_moe"))
    first = row.locator("td").nth(0)
    first.click()
    scenarios = page.locator("#matrix thead th.col").all_inner_texts()
    detail = page.inner_text("#cell-detail")
    v2, v1, none = (int(x) for x in first.get_attribute("data-c").split(","))
    assert detail.startswith(f"qwen3_moe · {scenarios[0]} (pin auto): ")
    assert f"V2 {v2} · V1 {v1} · no runner {none}" in detail
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#cell-detail").startswith(f"qwen3_moe · {scenarios[1]} (pin auto)")
    page.keyboard.press("ArrowDown")
    below = page.evaluate("document.activeElement.parentElement.cells[0].textContent")
    assert page.inner_text("#cell-detail").startswith(f"{below} · {scenarios[1]}")
    page.keyboard.press("End")
    assert page.inner_text("#cell-detail").startswith(f"{below} · {scenarios[-1]}")
    # One tab stop for the whole grid: Tab leaves it.
    assert page.locator("#matrix td[tabindex='0']").count() == 1
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") != "TD"
    assert problems == []


def test_an_empty_fleet_says_no_data_yet(browser: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log", demo=False)
    try:
        page, problems = _signed_in(browser, svc, tokens["viewer"])
        page.wait_for_load_state("networkidle")
        notes = page.locator(".chart .no-data").all_inner_texts()
        assert len(notes) == 2 and all(n.startswith("No data yet") for n in notes)
        assert page.locator(".chart canvas").count() == 0
        page.goto(svc.url + "/decisions")
        assert page.inner_text("#decisions-count") == "0 matching"
        assert problems == []
    finally:
        svc.stop()


def test_explain_takes_inputs_as_json_and_says_what_is_wrong(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, _problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/explain")
    page.click("#inputs-field summary")
    page.fill(
        "textarea[name=config]",
        '{"architecture": "Qwen3ForCausalLM", "speculative_method": "ngram"}',
    )
    page.click("form#explain button[type=submit]")
    page.wait_for_selector("#decision")
    assert page.inner_text("#decision h2") == "Decision: runner V1"
    for query, words in [
        ("config=%5B1%5D", "inputs: a JSON object of spec fields, not a list"),
        ("config=%7Bx", "inputs: not valid JSON"),
        ("config=%7B%7D&command=vllm+serve+x", "not both"),
        ("config=%7B%22tensor_parallel_siz%22%3A+2%7D", "tensor_parallel_size"),
    ]:
        response = page.goto(f"{svc.url}/explain?{query}")
        assert response is not None and response.status == 422, query
        assert words in page.inner_text("#error"), (query, page.inner_text("#error"))
