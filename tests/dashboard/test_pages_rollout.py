"""The closed loop on the pages, in a real browser (Playwright driving Debian's chromium) against
real services: an operator starts a ramp and sees its steps and each gate's last figures, a
viewer sees them without a button; with approvals required, the requester cannot approve and
a second operator can; flips are scheduled and cancelled; the kill switch (an operator's) says
who still runs V2; an admin sees the webhook outbox and sends a dead delivery again."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import needs_chromium, signed_in
from service_helpers import LiveService, free_port, make_tokens, start_service

pytestmark = needs_chromium
COHORT = "llama-mistral-dense"  # off by default
FAST = {
    "TURNOUT_TICK_S": "0.2",
    "TURNOUT_WEBHOOK_POLL_S": "0.2",
    "TURNOUT_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",  # the receivers here are local
    "TURNOUT_WEBHOOK_MAX_ATTEMPTS": "1",
}


def _site(root: Path, env: dict[str, str]) -> tuple[LiveService, dict[str, str]]:
    from turnout.dashboard.store import tokens as token_store
    from turnout.dashboard.store.db import Database

    url = f"sqlite:///{root / 'pages.db'}"
    made = make_tokens(url)
    db = Database(url)
    with db.write_session() as s:
        _row, made["bob"] = token_store.create_token(
            session=s, name="bob", role=token_store.Role.operator, actor="t"
        )
        s.commit()
    db.dispose()
    return start_service(url, root / "svc.log", env={**FAST, **env}), made


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, str]]]:
    svc, made = _site(tmp_path_factory.mktemp("rollout"), {})
    yield svc, made
    svc.stop()


@pytest.fixture(scope="module")
def approving(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveService, dict[str, str]]]:
    svc, made = _site(tmp_path_factory.mktemp("approving"), {"TURNOUT_REQUIRE_APPROVAL": "true"})
    yield svc, made
    svc.stop()


def _api(svc: LiveService, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(
        method,
        svc.url + path,
        headers={"Authorization": f"Bearer {token}", **kw.pop("headers", {})},
        **kw,
    )


def _gates_read(page: Any, url: str) -> None:
    """Reload until the ticker has read the ramp's gates (it runs every 0.2 s)."""
    for _ in range(100):
        page.goto(url)
        if page.locator(f"#ramp-{COHORT} table.gates").count():
            return
        page.wait_for_timeout(100)
    raise AssertionError("the ticker never read the gates")


def test_an_operator_starts_a_ramp_and_sees_its_gates(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["operator"])
    page.goto(svc.url + "/canaries")
    row = page.locator(f"#cohort-{COHORT}")
    row.locator("details.ramp-start summary").click()
    form = row.locator("details.ramp-start form")
    form.locator("input[name=steps]").fill("10,50,100")
    form.locator("input[name=bake_min]").fill("5")
    form.locator("select[name=on_failure]").select_option("rollback")
    form.locator("input[name=reason]").fill("parity green on H200 (page test)")
    form.locator("button[type=submit]").click()
    assert page.inner_text("#message").endswith(f"of {COHORT}: started at 10%")
    assert row.locator("td.ramp-cell").inner_text().startswith("active · 10% (step 1/3)")
    assert row.locator("td.state").inner_text() == "on 10%"
    _gates_read(page, svc.url + "/canaries")
    ramp = page.locator(f"#ramp-{COHORT}")
    assert ramp.locator("ol.steps li.current").inner_text() == "10% 5 min"
    gates = {
        r.locator("td").nth(0).inner_text(): r.locator("td").nth(1).inner_text()
        for r in ramp.locator("table.gates tbody tr").all()
    }
    assert gates == {"kill_switch": "pass", "parity_evidence": "wait", "health_engines": "wait"}
    assert "llama: no parity run" in ramp.locator("tr.gate-parity_evidence").inner_text()
    assert "On a failing gate: rollback" in ramp.locator("p.ramp-next").inner_text()
    viewer, viewer_problems = signed_in(browser, svc, tokens["viewer"])
    viewer.goto(svc.url + "/canaries")
    assert viewer.locator(f"#ramp-{COHORT} table.gates").count() == 1
    assert viewer.locator("form.ramp-cancel, details.ramp-start, #schedule-form").count() == 0
    cancel = ramp.locator("form.ramp-cancel")
    cancel.locator("input[name=reason]").fill("page test done")
    cancel.locator("button[type=submit]").click()
    assert page.inner_text("#message").endswith(f"of {COHORT}: cancelled")
    assert page.locator(f"#ramp-{COHORT}").count() == 0
    assert problems == [] and viewer_problems == []


def test_a_flip_is_scheduled_and_cancelled(browser: Any, site: tuple) -> None:
    svc, tokens = site
    page, problems = signed_in(browser, svc, tokens["operator"])
    page.goto(svc.url + "/canaries")
    page.locator("#schedule-form summary").click()
    form = page.locator("#schedule-form form")
    form.locator("select[name=cohort]").select_option("pooling")
    form.locator("select[name=enabled]").select_option("false")
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(days=3)).replace(second=0, microsecond=0)
    form.locator("input[name=run_at]").fill(when.strftime("%Y-%m-%dT%H:%M"))
    form.locator("input[name=reason]").fill("maintenance window")
    form.locator("button[type=submit]").click()
    assert page.inner_text("#message").endswith(
        f"of pooling at {when:%Y-%m-%d %H:%M} UTC: scheduled"
    )
    row = page.locator("#scheduled table tbody tr").first
    assert row.locator("td").nth(0).inner_text() == f"{when:%Y-%m-%d %H:%M}"
    assert row.locator("td").nth(2).inner_text() == "disable"
    row.locator("input[name=reason]").fill("not needed")
    row.locator("button[type=submit]").click()
    assert page.inner_text("#message").endswith("of pooling: cancelled")
    assert "No flip is scheduled." in page.inner_text("#scheduled")
    assert problems == []


def test_the_kill_switch_says_who_still_runs_v2(browser: Any, site: tuple) -> None:
    svc, tokens = site
    before = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    events = [
        {
            "event_id": uuid.uuid4().hex,
            "at": before.isoformat(),
            "deployment_id": f"d{i}",
            "pack": "turnout",
            "family": "qwen3",
            "runner": "v2",
            "mode": "auto",
            "stage": "qwen3-canary",
            "reason_code": "DEFAULT",
        }
        for i in range(3)
    ]
    assert (
        _api(
            svc, tokens["operator"], "POST", "/api/v1/decisions", json={"events": events}
        ).status_code
        == 200
    )
    page, problems = signed_in(browser, svc, tokens["operator"])
    page.goto(svc.url + "/canaries")
    form = page.locator("form[action='/kill-switch']")
    form.locator("input[name=reason]").fill("V2 crash loop (page test)")
    form.locator("button[type=submit]").click()
    try:
        reach = page.inner_text("#kill-switch-reach")
        assert reach.startswith(
            "Still on V2 under it: 3 deployments whose latest decision, "
            "made before it was engaged, is V2"
        )
    finally:
        assert (
            _api(
                svc,
                tokens["operator"],
                "POST",
                "/api/v1/kill-switch",
                json={"engaged": False, "reason": "done"},
            ).status_code
            == 200
        )
    assert problems == []


def test_an_approval_takes_a_second_operator(browser: Any, approving: tuple) -> None:
    svc, tokens = approving
    alice, problems = signed_in(browser, svc, tokens["operator"])
    alice.goto(svc.url + "/canaries")
    alice.locator(f"#cohort-{COHORT} button.toggle").click()
    form = alice.locator(f"#confirm-{COHORT} form.confirm")
    form.locator("input[name=percentage]").fill("25")
    form.locator("input[name=reason]").fill("parity green (page test)")
    form.locator("button[type=submit]").click()
    assert "waiting for another operator's approval" in alice.inner_text("#message")
    pending = alice.locator("#approvals tbody tr").first
    assert pending.locator("td").first.inner_text() == "enable at 25 % now"
    assert pending.locator("form.approve").count() == 0
    assert "your request" in pending.inner_text()
    bob, bob_problems = signed_in(browser, svc, tokens["bob"])
    bob.goto(svc.url + "/canaries")
    approve = bob.locator("#approvals tbody tr").first.locator("form.approve")
    approve.locator("input[name=reason]").fill("dashboards checked")
    approve.locator("button[type=submit]").click()
    assert bob.inner_text("#message").endswith(": approved")
    assert bob.locator(f"#cohort-{COHORT} td.state").inner_text() == "on 25%"
    assert "Nothing waits for approval." in bob.inner_text("#approvals")
    viewer, viewer_problems = signed_in(browser, svc, tokens["viewer"])
    viewer.goto(svc.url + "/audit")
    actions = viewer.locator("#audit tbody tr td:nth-child(3)").all_inner_texts()
    assert actions[:3] == ["canary.flip", "flip.approve", "flip.request"]
    assert problems == [] and bob_problems == [] and viewer_problems == []


def test_an_admin_sees_the_outbox_and_retries_a_dead_delivery(browser: Any, site: tuple) -> None:
    svc, tokens = site
    down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: one attempt, then dead
    r = _api(
        svc,
        tokens["admin"],
        "POST",
        "/api/v1/webhooks",
        json={"url": down, "kinds": ["flip"], "description": "page test"},
    )
    assert r.status_code == 201, r.text
    version = _api(svc, tokens["operator"], "GET", "/api/v1/canaries/quantized").headers["ETag"]
    _api(
        svc,
        tokens["operator"],
        "PATCH",
        "/api/v1/canaries/quantized",
        json={"enabled": True, "reason": "page test"},
        headers={"If-Match": version},
    )
    operator, operator_problems = signed_in(browser, svc, tokens["operator"])
    assert operator.locator("nav a[href='/webhooks']").count() == 0
    page, problems = signed_in(browser, svc, tokens["admin"])
    for _ in range(100):  # the worker tries once (TURNOUT_WEBHOOK_MAX_ATTEMPTS=1)
        page.goto(svc.url + "/webhooks?state=dead")
        if page.locator("#outbox tr.delivery.dead").count():
            break
        page.wait_for_timeout(100)
    row = page.locator("#outbox tr.delivery.dead").first
    assert "ConnectError" in row.inner_text() and "canary.flip quantized" in row.inner_text()
    assert page.locator("#subscriptions").inner_text().count("page test") == 1
    row.locator("button[type=submit]").click()
    assert page.inner_text("#message").endswith("is pending again")
    assert problems == [] and operator_problems == []
