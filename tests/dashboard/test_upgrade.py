"""The upgrade preview on SQLite and PostgreSQL: recorded deployments decided by two release
packs, per family what would switch and why (GET /api/v1/upgrade-preview, the store's
recorded_deployments); bad pack names are a 422 that says which packs exist."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from service_helpers import Api, api_events

from turnout.dashboard.store import aggregates, events
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.events import EventRecord
from turnout.oracle import DeploymentConfig

QWEN3 = {"architecture": "Qwen3ForCausalLM"}
# deployment id -> the config its engine reported (None: it reported none)
FLEET: dict[str, dict[str, Any] | None] = {
    "ngram": {**QWEN3, "speculative_method": "ngram"},  # 0.31 V1 -> 0.32 V2
    "mamba-all": {**QWEN3, "mamba_cache_mode": "all"},  # 0.31 V1 -> 0.32 refused
    "seq-par": {**QWEN3, "enable_sequence_parallelism": True, "tensor_parallel_size": 2},
    "plain": dict(QWEN3),  # V2 under both
    "no-config": None,
    "unreadable": {**QWEN3, "no_such_field": 1},  # this build cannot read it
}


def _record(api: Api, fleet: dict[str, dict[str, Any] | None], **over: Any) -> None:
    batch = []
    for n, (dep, config) in enumerate(fleet.items()):
        event = api_events(1, **over)[0]
        event.update(deployment_id=dep, config=config, event_id=f"e-{dep}-{n}")
        batch.append(event)
    r = api.client.post("/api/v1/decisions", json={"events": batch}, headers=api.h("operator"))
    assert r.status_code == 200, r.text


def _preview(api: Api, **params: str) -> dict[str, Any]:
    r = api.client.get("/api/v1/upgrade-preview", params=params, headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    return r.json()


def test_recorded_deployments_switch_per_family_with_both_sides_reasons(api: Api) -> None:
    _record(api, FLEET)
    body = _preview(api, **{"from": "vllm-0.31", "to": "vllm-0.32"})
    assert (body["from_pack"], body["to_pack"]) == ("vllm-0.31", "vllm-0.32")
    assert (
        body["num_deployments"],
        body["num_considered"],
        body["num_without_config"],
        body["num_unreadable"],
        body["num_changed"],
    ) == (6, 4, 1, 1, 3)
    assert body["changes"] == {"v1→v2": 1, "v1→refuse": 2}
    assert body["unknown_fields"] == {"vllm-0.31": [], "vllm-0.32": ["enable_sequence_parallelism"]}
    (qwen3,) = body["families"]
    assert (qwen3["family"], qwen3["label"], qwen3["deployments"], qwen3["changed"]) == (
        "qwen3",
        "Qwen3",
        4,
        3,
    )
    examples = {e["deployment_id"]: e for e in qwen3["examples"]}
    assert set(examples) == {"ngram", "mamba-all", "seq-par"}
    assert examples["ngram"]["before"]["why"] == ["unsupported_speculative_method"]
    assert examples["ngram"]["after"]["runner"] == "v2"
    assert examples["mamba-all"]["after"]["why"] == ["step.mamba_cache_mode_all_refused"]
    assert examples["seq-par"]["after"]["error_code"] == "unknown_setting"
    assert qwen3["examples"][0]["change"] == "v1→refuse"  # the most common change first


def test_defaults_the_service_pack_and_demo_rows(api: Api) -> None:
    _record(api, {"ngram": FLEET["ngram"]}, demo=True)
    body = _preview(api)
    assert (body["from_pack"], body["to_pack"]) == ("vllm-0.32", "vllm-0.33")
    assert _preview(api, to="vllm-0.32")["from_pack"] == "vllm-0.31"
    # The service's own pack (turnout) decides with the live canaries, V1 with ngram.
    own = _preview(api, **{"from": "turnout", "to": "vllm-0.32"})
    assert own["changes"] == {"v1→v2": 1}
    assert (
        _preview(api, **{"from": "vllm-0.31", "to": "vllm-0.32"}, include_demo="false")[
            "num_deployments"
        ]
        == 0
    )


@pytest.mark.parametrize(
    ("params", "code", "says"),
    [
        ({"from": "vllm-0.3"}, "unknown_pack", "from: unknown pack 'vllm-0.3'"),
        ({"to": "policies/vllm-0.31"}, "unknown_pack", "the packs: vllm-0.33"),
        ({"to": ""}, "invalid_request", "query parameter to"),
        ({"from_pack": "vllm-0.31"}, "invalid_request", "not a parameter of this route"),
    ],
)
def test_bad_pack_names_are_a_422_that_names_the_packs(
    api: Api, params: dict[str, str], code: str, says: str
) -> None:
    r = api.client.get("/api/v1/upgrade-preview", params=params, headers=api.h("viewer"))
    assert r.status_code == 422
    assert r.json()["detail"]["code"] == code and says in r.json()["detail"]["message"]


def test_the_preview_needs_a_token(api: Api) -> None:
    assert api.client.get("/api/v1/upgrade-preview").status_code == 401
    assert "/api/v1/upgrade-preview" in api.client.get("/api/v1/openapi.json").json()["paths"]


@pytest.fixture
def db(db_url: str) -> Database:
    database = Database(db_url)
    database.upgrade()
    yield database
    database.dispose()


def test_recorded_deployments_reads_each_latest_decision_and_its_config(db: Database) -> None:
    at = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)
    config = DeploymentConfig(architecture="Qwen3ForCausalLM").to_spec()

    def event(eid: str, dep: str, hours: int, runner: str, demo: bool = False) -> EventRecord:
        return EventRecord(
            event_id=eid,
            at=at + dt.timedelta(hours=hours),
            deployment_id=dep,
            pack="turnout",
            family="qwen3",
            runner=runner,
            mode="auto",
            reason_code="STATIC",
            config=config,
            demo=demo,
        )

    with db.write_session() as s:
        events.ingest(
            session=s,
            events=[
                event("a1", "b", 0, "v1"),
                event("a2", "b", 1, "v2"),
                event("a3", "a", 0, "v1", demo=True),
            ],
        )
        s.commit()
    with db.read_session() as s:
        rows = aggregates.recorded_deployments(session=s)
        real = aggregates.recorded_deployments(session=s, include_demo=False)
    assert [(r.deployment_id, r.runner, r.demo) for r in rows] == [
        ("a", "v1", True),
        ("b", "v2", False),
    ]
    assert rows[1].config == config and rows[1].pack == "turnout"
    assert [r.deployment_id for r in real] == ["b"]
