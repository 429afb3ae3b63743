"""The fallback-reasons page and its API in a real browser and service: the charts split
"blocked by a feature" from "waiting for its stage", the window / stage / family filters give
the counts the API gives, an empty selection says "no data yet", and every family of the demo
fleet is reachable from the charts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, make_tokens, start_service

from turnout.dashboard import fallbacks as view
from turnout.dashboard.store.aggregates import FallbackReport
from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.client import event_from_decision

browser_only = needs_chromium
NOW = dt.datetime.now(dt.UTC)
# (spec, count, age): real decisions of the turnout pack, reported at these ages.
LLAMA = {"architecture": "LlamaForCausalLM"}  # stage llama-mistral-dense is off: waiting
NGRAM = {
    "architecture": "Qwen3ForCausalLM",
    "speculative_method": "ngram",
    "num_speculative_tokens": 3,
}  # blocked: ngram_speculation
LOGITS = {"architecture": "LlamaForCausalLM", "logits_processors": ["x"]}  # blocked
FLEET = [
    (LLAMA, 10, dt.timedelta(minutes=20)),
    (LLAMA, 10, dt.timedelta(hours=5)),
    (LLAMA, 10, dt.timedelta(days=3)),
    (NGRAM, 3, dt.timedelta(minutes=20)),
    (NGRAM, 3, dt.timedelta(days=2)),
    (LOGITS, 4, dt.timedelta(days=10)),
    ({"architecture": "Qwen3ForCausalLM"}, 5, dt.timedelta(minutes=10)),  # V2
    ({"architecture": "MistralForCausalLM"}, 5, dt.timedelta(hours=2)),
]  # waiting
# window / filter → (deployments, not on V2, blocked, waiting)
WANT = {
    "": (50, 45, 10, 35),
    "window=7d": (46, 41, 6, 35),
    "window=24h": (33, 28, 3, 25),
    "window=1h": (18, 13, 3, 10),
    "stage=llama-mistral-dense": (39, 39, 4, 35),
    "family=mistral": (5, 5, 0, 5),
    "window=1h&stage=llama-mistral-dense": (10, 10, 0, 10),
}


def _fleet_events() -> list[dict[str, object]]:
    pack = load_pack("turnout")
    out = []
    for n, (spec, count, age) in enumerate(FLEET):
        config = from_spec(spec)
        decision = decide(config, pack=pack)
        out += [
            event_from_decision(
                decision,
                config,
                pack="turnout",
                at=NOW - age,
                deployment_id=f"dep-{n}-{i}",
                event_id=f"ev-{n}-{i}",
            )
            for i in range(count)
        ]
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, str]]]:
    root = tmp_path_factory.mktemp("fleet")
    url = f"sqlite:///{root / 'fleet.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, root / "svc.log")
    r = httpx.post(
        svc.url + "/api/v1/decisions",
        json={"events": _fleet_events()},
        headers={"Authorization": f"Bearer {tokens['operator']}"},
    )
    assert r.status_code == 200 and r.json()["inserted"] == 50, r.text
    yield svc, tokens
    svc.stop()


_signed_in = signed_in


def _api(svc: LiveService, token: str, query: str) -> dict[str, object]:
    r = httpx.get(
        f"{svc.url}/api/v1/fallbacks?{query}", headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def _summary(page: object) -> tuple[int, ...]:
    return tuple(
        int(page.inner_text(f"#num-{k}"))  # type: ignore[attr-defined]
        for k in ("deployments", "fallbacks", "blocked", "waiting")
    )


def _datasets(page: object, canvas: str) -> list[str]:
    return page.evaluate(  # type: ignore[attr-defined,no-any-return]
        f"window.Chart.getChart(document.getElementById('{canvas}'))"
        ".data.datasets.map(d => d.label)"
    )


@pytest.mark.parametrize("query", list(WANT))
def test_the_api_counts_deployments_in_the_window_and_filters(fleet: tuple, query: str) -> None:
    svc, tokens = fleet
    body = _api(svc, tokens["viewer"], query)
    got = (
        body["num_deployments"],
        body["num_fallbacks"],
        body["by_kind"]["blocked"],
        body["by_kind"]["waiting"],
    )
    assert got == WANT[query]
    # The time chart counts the deployments the ranking counts.
    for reason in body["ranked"]:
        assert sum(body["over_time"]["by_reason"][reason["key"]]) == reason["deployments"]


@pytest.mark.parametrize(
    "query, code, message",
    [
        ("family=Llama", "unknown_family", "unknown family 'Llama' (did you mean 'llama'?)"),
        (
            "stage=llama",
            "unknown_cohort",
            "'llama' is a family: filter by family, or by its stage 'llama-mistral-dense'",
        ),
    ],
)
def test_an_unknown_filter_is_a_422_naming_the_closest(
    fleet: tuple, query: str, code: str, message: str
) -> None:
    svc, tokens = fleet
    r = httpx.get(
        f"{svc.url}/api/v1/fallbacks?{query}",
        headers={"Authorization": f"Bearer {tokens['viewer']}"},
    )
    assert r.status_code == 422 and r.json()["detail"]["code"] == code
    assert message in r.json()["detail"]["message"]
    r = httpx.get(
        f"{svc.url}/api/v1/fallbacks?window=2d",
        headers={"Authorization": f"Bearer {tokens['viewer']}"},
    )
    assert r.status_code == 422


@browser_only
def test_the_charts_split_blocked_from_waiting(browser: object, fleet: tuple) -> None:
    svc, tokens = fleet
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/fallbacks")
    assert _summary(page) == WANT[""]
    labels = view.KIND_TITLES
    assert page.inner_text("#kind-blocked h2").startswith(labels["blocked"])
    assert page.inner_text("#kind-waiting h2").startswith(labels["waiting"])
    blocked = _datasets(page, "blocked-family")
    waiting = _datasets(page, "waiting-family")
    assert _datasets(page, "blocked-time") == blocked and _datasets(page, "waiting-time") == waiting
    assert len(blocked) == 2 and not any("not yet enabled" in b for b in blocked)
    assert len(waiting) == 1 and waiting[0].startswith("not yet enabled for V2 (stage")
    kinds = page.eval_on_selector_all("#ranked tbody tr", "rs => rs.map(r => r.dataset.kind)")
    assert kinds == ["waiting", "blocked", "blocked"]
    assert page.locator("#kind-held").count() == 0  # no deployment held by an operator
    assert problems == []


@browser_only
def test_the_filters_apply_on_change_and_match_the_api(browser: object, fleet: tuple) -> None:
    svc, tokens = fleet
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/fallbacks")
    page.select_option("select[name=window]", "1h")
    page.wait_for_url("**/fallbacks?window=1h**")
    assert _summary(page) == WANT["window=1h"]
    assert "since" in page.inner_text("#summary")
    page.select_option("select[name=stage]", "llama-mistral-dense")
    page.wait_for_url("**stage=llama-mistral-dense**")
    assert _summary(page) == WANT["window=1h&stage=llama-mistral-dense"]
    assert page.locator("#kind-blocked p.no-data").count() == 2  # nothing blocked in this view
    assert page.locator("#kind-waiting canvas").count() == 2
    page.goto(svc.url + "/fallbacks?window=24h")
    api = _api(svc, tokens["viewer"], "window=24h")
    assert _summary(page)[:2] == (api["num_deployments"], api["num_fallbacks"])
    # One bar per hour of the window (and the current one), adding up to the table.
    bars = page.evaluate(
        "window.Chart.getChart(document.getElementById('waiting-time')).data.datasets[0].data"
    )
    assert len(bars) in (25, 26) and sum(bars) == WANT["window=24h"][3]
    page.select_option("select[name=family]", "mistral")
    page.wait_for_url("**family=mistral**")
    assert _summary(page) == WANT["family=mistral"]
    assert page.locator("#families tbody tr").count() == 1
    assert problems == []


@browser_only
def test_an_empty_selection_says_no_data_yet(browser: object, fleet: tuple) -> None:
    svc, tokens = fleet
    page, problems = _signed_in(browser, svc, tokens["viewer"])
    page.goto(svc.url + "/fallbacks?family=granite_moe")
    assert _summary(page) == (0, 0, 0, 0)
    assert page.locator("canvas").count() == 0
    notes = page.locator("section.kind p.no-data").all_inner_texts()
    assert len(notes) == 4 and all(n.startswith("No data yet") for n in notes)
    assert page.inner_text("#ranked tbody").startswith("No data yet")
    assert problems == []
    response = page.goto(svc.url + "/fallbacks?family=Llama")
    assert response is not None and response.status == 422
    assert "did you mean 'llama'?" in page.inner_text("#error")
    assert page.locator("select[name=family]").count() == 1  # the filters stay to correct it


@browser_only
def test_every_family_of_the_demo_fleet_is_reachable(browser: object, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log", demo=True)
    try:
        page, problems = _signed_in(browser, svc, tokens["viewer"])
        page.goto(svc.url + "/fallbacks")
        shown = page.evaluate(
            "window.Chart.getChart(document.getElementById('blocked-family')).data.labels.length"
        )
        assert shown == view.TOP_FAMILIES
        link = page.locator("#kind-blocked a.all-families")
        total = int(link.inner_text().split()[1])
        assert total > view.TOP_FAMILIES
        link.click()
        page.wait_for_url("**families=all**")
        labels = page.evaluate(
            "window.Chart.getChart(document.getElementById('blocked-family')).data.labels"
        )
        api = _api(svc, tokens["viewer"], "")
        blocked = {f for f, c in api["families"].items() if c["by_kind"]["blocked"]}
        assert len(labels) == total and set(labels) == blocked
        assert page.locator("#families tbody tr").count() == len(api["families"])
        assert problems == []
    finally:
        svc.stop()


def test_the_charts_show_the_top_reasons_and_sum_the_rest() -> None:
    from collections import Counter

    bins = [dt.datetime(2026, 12, 1, h, tzinfo=dt.UTC) for h in range(3)]
    ranked = [(f"rule_{i:02d}", 20 - i) for i in range(10)]
    report = FallbackReport(
        window="24h",
        bin_s=3600,
        ranked=ranked,
        bins=bins,
        by_kind=Counter(blocked=30),
        by_family={"llama": Counter(dict(ranked))},
        over_time={k: [n, 0, 0] for k, n in ranked},
    )
    v = view.View(report, {}, {})
    top = view.charts(v, all_families=False, all_reasons=False)["kinds"]["blocked"]
    assert [r["key"] for r in top["reasons"]] == [k for k, _n in ranked[:8]] + [""]
    assert top["reasons"][-1]["label"] == "2 other reasons"
    assert top["reasons"][-1]["by_family"] == [12 + 11]
    assert top["reasons"][-1]["over_time"] == [23, 0, 0] and top["num_reasons"] == 10
    every = view.charts(v, all_families=False, all_reasons=True)["kinds"]["blocked"]
    assert [r["key"] for r in every["reasons"]] == [k for k, _n in ranked]
    assert view.charts(v, all_families=False, all_reasons=False)["kinds"]["waiting"] is None
