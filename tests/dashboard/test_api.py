"""The JSON API in-process (FastAPI TestClient) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from service_helpers import Api, ack, api_events

from turnout.dashboard.api.rollout import read_canaries
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.dashboard.store import canaries as canary_store
from turnout.oracle import (
    CanarySnapshot,
    CohortState,
    decide,
    enumerate_matrix,
    explain,
    from_command,
    from_spec,
    load_pack,
)
from turnout.oracle.errors import ErrorCode

QWEN3 = {"architecture": "Qwen3ForCausalLM"}


def defaults(pack_name: str = "turnout") -> CanarySnapshot:
    """The pack's default canary state as an explicit snapshot (what a fresh store holds)."""
    pack = load_pack(pack_name)
    return CanarySnapshot(
        cohorts={
            c.id: CohortState(enabled=c.enabled, percentage=c.percentage) for c in pack.cohorts
        },
        kill_switch=pack.kill_switch,
    )


def _first_cohort(api: Api) -> dict[str, object]:
    r = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    assert r.status_code == 200
    return dict(r.json()["cohorts"][0])


def test_canaries_come_from_the_pack_in_rollout_order(api: Api) -> None:
    pack = load_pack("turnout")
    body = api.client.get("/api/v1/canaries", headers=api.h("viewer")).json()
    assert [c["cohort"] for c in body["cohorts"]] == [c.id for c in pack.cohorts]
    assert [c["enabled"] for c in body["cohorts"]] == [bool(c.enabled) for c in pack.cohorts]
    assert body["kill_switch"]["engaged"] is False and body["pack"] == "turnout"


def test_canaries_etag_and_304(api: Api) -> None:
    r = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    etag = r.headers["ETag"]
    r2 = api.client.get("/api/v1/canaries", headers={**api.h("viewer"), "If-None-Match": etag})
    assert r2.status_code == 304 and r2.content == b""
    # If-None-Match compares weakly (RFC 9110 13.1.2), lists and * included.
    for header in (f"W/{etag}", f'"nope", {etag}', "*"):
        r3 = api.client.get(
            "/api/v1/canaries", headers={**api.h("viewer"), "If-None-Match": header}
        )
        assert r3.status_code == 304, header
    r4 = api.client.get("/api/v1/canaries", headers={**api.h("viewer"), "If-None-Match": '"x"'})
    assert r4.status_code == 200 and r4.headers["ETag"] == etag


def test_the_served_snapshot_follows_every_flip_and_takes_no_query(api: Api) -> None:
    # GET /canaries is answered from the cached snapshot, its body serialised once per ETag:
    # a flip (this process's own, and another process's once its snapshot is stale: the
    # fixture's snapshot_ttl_s is 0) gives a new ETag and the body that goes with it.
    first = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    cohort = first.json()["cohorts"][0]
    url = f"/api/v1/canaries/{cohort['cohort']}"
    r = api.client.patch(
        url,
        json={"enabled": not cohort["enabled"], "reason": "served snapshot"},
        headers={**api.h("operator"), "If-Match": str(cohort["version"])},
    )
    assert r.status_code == 200, r.text
    second = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    assert second.headers["ETag"] != first.headers["ETag"]
    assert second.json()["cohorts"][0]["enabled"] is not cohort["enabled"]
    other = Services.build(Settings(database_url=api.services.db.url, demo=False))
    with other.db.write_session() as s:
        canary_store.set_kill_switch(session=s, engaged=True, reason="elsewhere", actor="t")
        s.commit()
    third = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    assert third.json()["kill_switch"]["engaged"] is True
    with api.services.db.read_session() as s:
        body, etag = read_canaries(api.services, s)
    assert (third.headers["ETag"], third.json()) == (etag, body.model_dump(mode="json"))
    other.db.dispose()
    r = api.client.get("/api/v1/canaries?pack=turnout", headers=api.h("viewer"))
    assert r.status_code == 422 and "it takes none" in r.text
    assert api.client.get("/api/v1/canaries").status_code == 401


def test_patch_needs_if_match_and_a_current_version(api: Api) -> None:
    cohort = _first_cohort(api)
    name, version = cohort["cohort"], cohort["version"]
    url = f"/api/v1/canaries/{name}"
    body = {"enabled": not cohort["enabled"], "reason": "parity green on H200"}
    assert api.client.patch(url, json=body, headers=api.h("operator")).status_code == 428
    r = api.client.patch(url, json=body, headers={**api.h("operator"), "If-Match": f'"{version}"'})
    assert r.status_code == 200 and r.json()["version"] == version + 1
    assert r.headers["ETag"] == f'"{version + 1}"'
    stale = api.client.patch(
        url, json=body, headers={**api.h("operator"), "If-Match": f'"{version}"'}
    )
    assert stale.status_code == 409
    assert stale.json()["detail"]["code"] == ErrorCode.VERSION_CONFLICT
    no_reason = api.client.patch(
        url,
        json={"enabled": True, "reason": " "},
        headers={**api.h("operator"), "If-Match": str(version + 1)},
    )
    assert no_reason.status_code == 422
    unknown = api.client.patch(
        "/api/v1/canaries/nope", json=body, headers={**api.h("operator"), "If-Match": "1"}
    )
    assert unknown.status_code == 404
    audit = api.client.get("/api/v1/audit", headers=api.h("viewer")).json()
    assert [(a["action"], a["reason"]) for a in audit if a["action"] == "canary.flip"] == [
        ("canary.flip", "parity green on H200")
    ]
    assert audit[0]["actor"].startswith("operator")


def _flips(api: Api) -> list[dict[str, object]]:
    audit = api.client.get("/api/v1/audit", headers=api.h("viewer")).json()
    return [a for a in audit if a["action"] == "canary.flip"]


def test_patch_to_the_current_state_changes_nothing(api: Api) -> None:
    cohort = _first_cohort(api)  # on at 100% by default
    name, version = cohort["cohort"], cohort["version"]
    url = f"/api/v1/canaries/{name}"
    etag = api.client.get("/api/v1/canaries", headers=api.h("viewer")).headers["ETag"]
    op = {**api.h("operator"), "If-Match": str(version)}
    for body in (
        {"enabled": True, "reason": "again"},
        {"enabled": True, "percentage": cohort["percentage"], "reason": "again"},
    ):
        r = api.client.patch(url, json=body, headers=op)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["changed"] is False
        assert (out["enabled"], out["percentage"], out["version"]) == (True, 100, version)
        assert r.headers["ETag"] == f'"{version}"'
    assert _flips(api) == []
    assert api.client.get("/api/v1/canaries", headers=api.h("viewer")).headers["ETag"] == etag
    samples = api.services.metrics.registry.get_sample_value
    assert not samples("turnout_canary_flips_total", {"cohort": name})
    r = api.client.patch(url, json={"enabled": False, "reason": "off"}, headers=op)
    assert r.json()["changed"] is True and r.json()["version"] == version + 1
    assert [a["reason"] for a in _flips(api)] == ["off"]
    assert samples("turnout_canary_flips_total", {"cohort": name}) == 1


def test_kill_switch_set_to_its_current_state_changes_nothing(api: Api) -> None:
    # Two operators engaging it in one incident: the second is told, not audited twice.
    url, admin = "/api/v1/kill-switch", api.h("admin")
    released = api.client.post(url, json={"engaged": False, "reason": "not engaged"}, headers=admin)
    assert released.status_code == 200, released.text
    assert (released.json()["changed"], released.json()["version"]) == (False, 1)
    etag = api.client.get("/api/v1/canaries", headers=api.h("viewer")).headers["ETag"]
    first = api.client.post(url, json={"engaged": True, "reason": "incident 7"}, headers=admin)
    second = api.client.post(
        url, json={"engaged": True, "reason": "incident 7, me too"}, headers=admin
    )
    assert (first.json()["changed"], first.json()["version"]) == (True, 2)
    assert (second.json()["changed"], second.json()["engaged"], second.json()["version"]) == (
        False,
        True,
        2,
    )
    audit = api.client.get("/api/v1/audit", headers=api.h("viewer")).json()
    assert [a["reason"] for a in audit if a["action"] == "kill_switch.set"] == ["incident 7"]
    state = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    assert state.headers["ETag"] != etag and state.json()["kill_switch"]["version"] == 2
    assert "changed" not in state.json()["kill_switch"]


def test_page_flip_to_the_current_state_says_nothing_changed(api: Api) -> None:
    cohort = _first_cohort(api)
    csrf = api.sign_in("operator")
    try:
        r = api.client.post(
            f"/canaries/{cohort['cohort']}",
            follow_redirects=False,
            data={
                "enabled": "true",
                "version": cohort["version"],
                "percentage": "100",
                "reason": "again",
                "csrf": csrf,
            },
        )
        assert r.status_code == 303
        page = api.client.get(r.headers["location"]).text
    finally:
        api.client.cookies.clear()
    assert f"{cohort['cohort']} already enabled at 100%: nothing changed" in page
    assert _flips(api) == []
    assert _first_cohort(api)["version"] == cohort["version"]


def test_page_kill_switch_to_its_current_state_says_nothing_changed(api: Api) -> None:
    csrf = api.sign_in("admin")
    try:
        r = api.client.post(
            "/kill-switch",
            follow_redirects=False,
            data={"engaged": "false", "reason": "already off", "csrf": csrf},
        )
        assert r.status_code == 303
        page = api.client.get(r.headers["location"]).text
    finally:
        api.client.cookies.clear()
    assert "kill switch already released: nothing changed" in page
    audit = api.client.get("/api/v1/audit", headers=api.h("viewer")).json()
    assert [a for a in audit if a["action"] == "kill_switch.set"] == []


def test_every_listed_cohort_id_is_accepted_by_patch_and_impact(api: Api) -> None:
    listed = api.client.get("/api/v1/canaries", headers=api.h("viewer")).json()["cohorts"]
    for c in listed:
        url = f"/api/v1/canaries/{c['cohort']}"
        assert api.client.get(url, headers=api.h("viewer")).status_code == 200
        r = api.client.patch(
            url,
            json={"enabled": c["enabled"], "reason": "same"},
            headers={**api.h("operator"), "If-Match": str(c["version"])},
        )
        assert r.status_code == 200 and r.json()["changed"] is False, r.text
        r = api.client.get(
            "/api/v1/impact",
            params={"cohort": c["cohort"], "enabled": "true"},
            headers=api.h("viewer"),
        )
        assert r.status_code == 200 and r.json()["cohort"] == c["cohort"], r.text


def _not_found(api: Api, name: str) -> list[str]:
    """The 404 messages of GET/PATCH /canaries/{name} and GET /impact?cohort={name}."""
    answers = [
        api.client.get(f"/api/v1/canaries/{name}", headers=api.h("viewer")),
        api.client.patch(
            f"/api/v1/canaries/{name}",
            json={"enabled": True, "reason": "x"},
            headers={**api.h("operator"), "If-Match": "1"},
        ),
        api.client.get(
            "/api/v1/impact", params={"cohort": name, "enabled": "true"}, headers=api.h("viewer")
        ),
    ]
    assert [r.status_code for r in answers] == [404] * 3, [r.text for r in answers]
    assert {r.json()["detail"]["code"] for r in answers} == {ErrorCode.UNKNOWN_COHORT}
    messages = [r.json()["detail"]["message"] for r in answers]
    assert len(set(messages)) == 1
    return messages


def test_a_family_name_or_wrong_cohort_id_gets_a_404_that_says_what_exists(api: Api) -> None:
    ids = [c.id for c in load_pack("turnout").cohorts]
    listed = "cohorts: " + ", ".join(ids)
    assert _not_found(api, "qwen3")[0] == (
        f"'qwen3' is a family, not a cohort id: its stage is cohort 'qwen3-canary' ({listed})"
    )
    assert _not_found(api, "llama")[0].startswith(
        "'llama' is a family, not a cohort id: its stage is cohort 'llama-mistral-dense'"
    )
    assert _not_found(api, "gemma")[0] == (
        "'gemma' is a family, not a cohort id, and no stage lists it by name: its deployments "
        f"join a stage by their attributes (a decision's `stage` says which) ({listed})"
    )
    assert _not_found(api, "qwen3-canery")[0] == (
        f"unknown cohort 'qwen3-canery' (did you mean 'qwen3-canary'?); {listed}"
    )
    assert _not_found(api, "zzz")[0] == f"unknown cohort 'zzz'; {listed}"


def test_decide_uses_the_store_canaries_and_matches_the_oracle(api: Api) -> None:
    pack = load_pack("turnout")
    config = from_spec(QWEN3)
    r = api.client.post("/api/v1/decide", json={"config": QWEN3}, headers=api.h("viewer"))
    assert r.status_code == 200
    assert r.json() == decide(config, pack=pack, canaries=defaults()).to_json()
    # A fresh store holds the pack defaults: the digest is the one the CLI and every engine
    # without a snapshot (canaries=None) report for the same state.
    assert r.json()["policy_digest"] == decide(config, pack=pack).policy_digest
    # Engage the kill switch: the same deployment must now be decided with it.
    api.client.post(
        "/api/v1/kill-switch", json={"engaged": True, "reason": "incident"}, headers=api.h("admin")
    )
    snap = api.services.policy.snapshot().canaries
    r = api.client.post("/api/v1/decide", json={"config": QWEN3}, headers=api.h("viewer"))
    assert snap.kill_switch is True
    assert r.json() == decide(config, pack=pack, canaries=snap).to_json()
    assert r.json()["runner"] in ("v1", None)
    # /decide is served by a plain route ahead of FastAPI's: still authorized and measured.
    assert api.client.post("/api/v1/decide", json={"config": QWEN3}).status_code == 401
    assert (
        api.client.post(
            "/api/v1/decide", json={"config": QWEN3}, headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    metrics = api.client.get("/metrics").text
    assert 'route="/api/v1/decide",status="200"} 2.0' in metrics
    assert 'turnout_decisions_total{reason_code="DISABLED",runner="v1",source="api"} 1.0' in metrics


def test_decide_from_a_command_line_and_bad_input(api: Api) -> None:
    cmd = "VLLM_LOGGING_LEVEL=INFO vllm serve Qwen/Qwen3-8B \\\n  --tensor-parallel-size 2"
    r = api.client.post("/api/v1/decide", json={"command": cmd}, headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    want = decide(
        from_command(
            ["vllm", "serve", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2"],
            {"VLLM_LOGGING_LEVEL": "INFO"},
        ),
        pack=load_pack("turnout"),
        canaries=defaults(),
    )
    assert r.json() == want.to_json()
    bad = api.client.post(
        "/api/v1/decide", json={"command": "vllm serve <checkpoint>"}, headers=api.h("viewer")
    )
    assert bad.status_code == 422 and bad.json()["detail"]["message"]
    both = api.client.post(
        "/api/v1/decide", json={"config": QWEN3, "command": "x"}, headers=api.h("viewer")
    )
    assert both.status_code == 422


def test_decide_refuses_an_architecture_no_runner_serves(api: Api) -> None:
    # The turnout pack's manifests: no runner of this build loads Mamba. A decision, not bad
    # input: 200 with runner null and the stable error code.
    r = api.client.post(
        "/api/v1/decide",
        json={"config": {"architecture": "Mamba2ForCausalLM"}},
        headers=api.h("viewer"),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["runner"] is None and body["error_code"] == "architecture_not_served"
    assert body["error"].startswith(
        "no runner of this build serves architecture 'Mamba2ForCausalLM'"
    )
    want = decide(
        from_spec({"architecture": "Mamba2ForCausalLM"}),
        pack=load_pack("turnout"),
        canaries=defaults(),
    )
    assert body == want.to_json()


def test_explain_answers_with_changes_that_reach_v2(api: Api) -> None:
    spec = {**QWEN3, "speculative_method": "ngram", "num_speculative_tokens": 3}
    r = api.client.post("/api/v1/explain", json={"config": spec}, headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    config = from_spec(spec)
    assert body == explain(config, pack=load_pack("turnout"), canaries=defaults()).to_json()
    assert body["decision"]["runner"] == "v1"
    assert body["suggestions"] and all(s["changes"] for s in body["suggestions"])
    assert any(
        c["dimension"] == "speculative_method" for s in body["suggestions"] for c in s["changes"]
    )


def test_explain_combined_suggestion_applied_through_the_service_reaches_v2(api: Api) -> None:
    spec = {"architecture": "LlamaForCausalLM", "cpu_offload_gb": 4}
    r = api.client.post("/api/v1/explain", json={"config": spec}, headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["note"] is None
    combined = next(s for s in body["suggestions"] if s["kind"] == "config+canary")
    assert combined["text"] == ("cpu_offload_gb 4.0 → 0; canary:llama-mistral-dense off → on 100%")
    # Apply it: the canary flip through the API, the config change in the deployment.
    changed = dict(spec)
    for change in combined["changes"]:
        if change["dimension"].startswith("canary:"):
            stage = change["dimension"].removeprefix("canary:")
            version = api.client.get(f"/api/v1/canaries/{stage}", headers=api.h("viewer")).json()[
                "version"
            ]
            flip = api.client.patch(
                f"/api/v1/canaries/{stage}",
                json={"enabled": True, "percentage": 100, "reason": "x"},
                headers={**api.h("operator"), "If-Match": str(version)},
            )
            assert flip.status_code == 200, flip.text
        else:
            changed[change["dimension"]] = change["to"]
    r = api.client.post("/api/v1/decide", json={"config": changed}, headers=api.h("viewer"))
    assert r.json()["runner"] == "v2"
    r = api.client.post("/api/v1/decide", json={"config": spec}, headers=api.h("viewer"))
    assert r.json()["runner"] == "v1"  # the canary alone does not do it


def test_matrix_summarises_every_cell_of_the_oracle(api: Api) -> None:
    r = api.client.get("/api/v1/matrix", headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    cells = list(enumerate_matrix(load_pack("turnout"), defaults()))
    assert body["num_cells"] == len(cells)
    assert sorted(body["pins"]) == sorted({c.pin for c in cells})
    want = sum(
        1
        for c in cells
        if (c.pin, c.family, c.scenario.id, c.decision.runner) == ("auto", "qwen3", "default", "v2")
    )
    assert want > 0 and body["grid"]["auto"]["qwen3"]["default"]["v2"] == want


def test_ingest_is_idempotent_and_feeds_fallbacks_and_metrics(api: Api) -> None:
    batch = api_events(30)
    r = api.client.post("/api/v1/decisions", json={"events": batch}, headers=api.h("operator"))
    assert r.json() == ack(batch, 30)
    r = api.client.post("/api/v1/decisions", json={"events": batch}, headers=api.h("operator"))
    assert r.json() == ack(batch, 0)
    fb = api.client.get("/api/v1/fallbacks?window=all", headers=api.h("viewer")).json()
    assert fb["num_deployments"] == 30 and fb["num_fallbacks"] == 30
    assert fb["ranked"][0]["key"] == "ngram_speculation" and fb["ranked"][0]["deployments"] == 30
    assert fb["by_family"] == {"qwen3": {"ngram_speculation": 30}}
    rows = api.client.get(
        "/api/v1/decisions?family=qwen3&runner=v1&limit=5", headers=api.h("viewer")
    ).json()
    assert len(rows) == 5 and all(e["runner"] == "v1" for e in rows)
    metrics = api.client.get("/metrics").text
    assert (
        'turnout_decisions_total{reason_code="STATIC",runner="v1",source="ingest"} 60.0' in metrics
    )
    assert (
        'turnout_api_request_duration_seconds_count{method="POST",route="/api/v1/decisions"'
        in metrics
    )


def test_fallbacks_list_the_first_reasons_and_sum_the_rest(api: Api) -> None:
    # 12 reasons of the pack, reason i on 12 - i deployments (so the ranking is known), each
    # deployment of family qwen3 or llama by parity.
    rules = sorted(r for r in load_pack("turnout").rule_ids if "." not in r)[:12]
    assert len(rules) == 12
    batch = []
    for i, rule in enumerate(rules):
        for j in range(12 - i):
            family = "qwen3" if j % 2 == 0 else "llama"
            batch += api_events(1, deployment_id=f"{rule}-{j}", rule_ids=[rule], family=family)
    r = api.client.post("/api/v1/decisions", json={"events": batch}, headers=api.h("operator"))
    assert r.status_code == 200, r.text
    whole = api.client.get("/api/v1/fallbacks?limit=1000", headers=api.h("viewer")).json()
    assert whole["num_reasons"] == 12 and whole["other"] is None
    assert [x["key"] for x in whole["ranked"]] == rules
    fb = api.client.get("/api/v1/fallbacks?limit=5", headers=api.h("viewer")).json()
    assert fb["num_reasons"] == 12 and [x["key"] for x in fb["ranked"]] == rules[:5]
    other = fb["other"]
    assert other["num_reasons"] == 7 and other["deployments"] == sum(range(1, 8))
    for family, counts in whole["by_family"].items():
        assert set(fb["by_family"][family]) <= set(rules[:5])
        assert sum(fb["by_family"][family].values()) + other["by_family"][family] == sum(
            counts.values()
        )
    total_bins = [sum(col) for col in zip(*whole["over_time"]["by_reason"].values(), strict=True)]
    shown_bins = [sum(col) for col in zip(*fb["over_time"]["by_reason"].values(), strict=True)]
    assert [a + b for a, b in zip(shown_bins, other["over_time"], strict=True)] == total_bins
    # Counts that do not depend on the limit stay whole.
    assert (fb["num_deployments"], fb["num_fallbacks"]) == (sum(range(1, 13)),) * 2
    for bad in ("0", "1001", "x"):
        r = api.client.get(f"/api/v1/fallbacks?limit={bad}", headers=api.h("viewer"))
        assert r.status_code == 422, (bad, r.text)


@pytest.mark.parametrize(
    "at", ["2026-11-29T10:00:00", "0997-09-07T04:16:00+00:00", "2999-01-01T00:00:00Z"]
)
def test_ingest_rejects_a_bad_batch_whole(api: Api, at: str) -> None:
    batch = api_events(3)
    batch[1]["at"] = at  # no timezone / implausible times
    r = api.client.post("/api/v1/decisions", json={"events": batch}, headers=api.h("operator"))
    assert r.status_code == 422
    assert "events" in str(r.json()["detail"])
    fb = api.client.get("/api/v1/fallbacks", headers=api.h("viewer")).json()
    assert fb["num_deployments"] == 0


def test_impact_counts_recorded_deployments_that_would_switch(api: Api) -> None:
    pack = load_pack("turnout")
    config = from_spec(QWEN3)
    cohort = decide(config, pack=pack).stage
    assert cohort is not None
    events = api_events(
        5, config=config.to_spec(), rule_ids=[], reason_code="DISABLED", stage=cohort
    )
    api.client.post("/api/v1/decisions", json={"events": events}, headers=api.h("operator"))
    enabled = {
        c["cohort"]: c["enabled"]
        for c in api.client.get("/api/v1/canaries", headers=api.h("viewer")).json()["cohorts"]
    }
    r = api.client.get(
        f"/api/v1/impact?cohort={cohort}&enabled={str(not enabled[cohort]).lower()}",
        headers=api.h("viewer"),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["num_considered"] == 5 and body["num_changed"] == 5
    assert (body["to_v2"], body["to_v1"]) == ((5, 0) if not enabled[cohort] else (0, 5))
    same = api.client.get(
        f"/api/v1/impact?cohort={cohort}&enabled={str(enabled[cohort]).lower()}",
        headers=api.h("viewer"),
    ).json()
    assert same["num_changed"] == 0


def test_health_openapi_and_reads_need_a_token(api: Api) -> None:
    assert api.client.get("/healthz").json()["status"] == "ok"
    spec = api.client.get("/api/v1/openapi.json").json()
    assert "/api/v1/canaries/{cohort}" in spec["paths"]
    for path in ("/api/v1/canaries", "/api/v1/audit", "/api/v1/fallbacks", "/api/v1/decisions"):
        assert api.client.get(path).status_code == 401
        assert api.client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert api.client.get(path, headers=api.h("viewer")).status_code == 200


def test_tokens_api_creates_shows_once_and_revokes(api: Api) -> None:
    r = api.client.post(
        "/api/v1/tokens", json={"name": "engine fleet", "role": "operator"}, headers=api.h("admin")
    )
    assert r.status_code == 201
    created = r.json()
    listed = api.client.get("/api/v1/tokens", headers=api.h("admin")).json()
    assert all("token" not in t for t in listed)
    new = {"Authorization": f"Bearer {created['token']}"}
    assert api.client.get("/api/v1/canaries", headers=new).status_code == 200
    r = api.client.post(
        f"/api/v1/tokens/{created['id']}/revoke", json={"reason": "rotated"}, headers=api.h("admin")
    )
    assert r.status_code == 200 and r.json()["revoked"] is True
    assert api.client.get("/api/v1/canaries", headers=new).status_code == 401
    # Found by schemathesis: an id past 64 bits was a driver overflow (500), now a 422.
    r = api.client.post(
        f"/api/v1/tokens/{2**64}/revoke", json={"reason": "x"}, headers=api.h("admin")
    )
    assert r.status_code == 422
    me = api.client.get("/api/v1/tokens", headers=api.h("admin")).json()
    admin_id = next(t["id"] for t in me if t["role"] == "admin" and t["name"] == "admin")
    r = api.client.post(
        f"/api/v1/tokens/{admin_id}/revoke", json={"reason": "oops"}, headers=api.h("admin")
    )
    assert r.status_code == 409 and r.json()["detail"]["code"] == ErrorCode.SELF_REVOKE


def test_parity_evidence_is_recorded_listed_and_shown_with_its_stage(api: Api) -> None:
    pack = load_pack("turnout")
    stage = next(c for c in pack.cohorts if c.families)
    family = stage.families[0]
    for result in ("fail", "pass"):
        r = api.client.post(
            "/api/v1/evidence",
            headers=api.h("operator"),
            json={"family": family, "suite": "tests/parity", "result": result},
        )
        assert r.status_code == 201 and r.json()["recorded_by"].startswith("operator")
    listed = api.client.get(f"/api/v1/evidence?family={family}", headers=api.h("viewer")).json()
    assert [e["result"] for e in listed] == ["pass", "fail"]  # newest first
    api.sign_in("viewer")
    try:
        page = api.client.get("/canaries").text
    finally:
        api.client.cookies.clear()
    row = page[page.index(f'id="cohort-{stage.id}"') :]
    assert f"{family} pass" in row[: row.index("</tr>")]
