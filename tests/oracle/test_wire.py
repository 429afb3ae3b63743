"""oracle.wire: the service's bodies defined once, as the service answers and takes them and
as engines and the CLI read and write them."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from turnout.oracle import CanarySnapshot, CohortState, decide, from_spec, load_pack
from turnout.oracle.client import event_from_decision, snapshot_from_json
from turnout.oracle.wire import (
    CanariesOut,
    CohortOut,
    CommandsFileLine,
    DeploymentIn,
    EventIn,
    KillSwitchOut,
    LaunchIn,
    OracleSnapshotIn,
    SnapshotIn,
    StartupIn,
    decision_event,
)

AT = dt.datetime(2026, 11, 30, 10, tzinfo=dt.UTC)


def _served() -> CanariesOut:
    return CanariesOut(
        pack="turnout",
        pack_digest="00d788bcb4832212",
        kill_switch=KillSwitchOut(engaged=False, version=3, updated_at=AT, updated_by="a"),
        cohorts=[
            CohortOut(
                cohort="qwen3-canary",
                label="Qwen3",
                position=0,
                enabled=True,
                percentage=40,
                version=2,
                updated_at=AT,
                updated_by="alice",
            ),
            CohortOut(
                cohort="all-dense",
                label="dense",
                position=5,
                enabled=False,
                percentage=100,
                version=1,
                updated_at=AT - dt.timedelta(days=1),
                updated_by="pack defaults",
            ),
        ],
    )


def test_what_the_service_answers_is_what_engines_read() -> None:
    body = json.loads(_served().model_dump_json())
    read = SnapshotIn.parse(body)
    assert read.to_snapshot() == CanarySnapshot(
        {"qwen3-canary": CohortState(True, 40), "all-dense": CohortState(False, 100)}
    )
    assert snapshot_from_json(body) == read.to_snapshot()
    last = read.last_change()
    assert last is not None and (last.cohort, last.version, last.updated_by) == (
        "qwen3-canary",
        2,
        "alice",
    )


def test_readers_take_the_fields_they_need_and_ignore_new_ones() -> None:
    body = {
        "pack": "turnout",
        "kill_switch": {"engaged": True, "since": "x"},
        "cohorts": [{"cohort": "c", "enabled": True, "percentage": 5, "owner": "o"}],
        "schema": 2,
    }
    assert SnapshotIn.parse(body).to_snapshot() == CanarySnapshot(
        {"c": CohortState(True, 5)}, kill_switch=True
    )


@pytest.mark.parametrize(
    "change, says",
    [
        ({"enabled": "false"}, "cohorts[0].enabled: Input should be a valid boolean"),
        ({"percentage": "50"}, "cohorts[0].percentage: Input should be a valid integer"),
        ({"percentage": True}, "cohorts[0].percentage: Input should be a valid integer"),
        ({"percentage": 50.0}, "cohorts[0].percentage: Input should be a valid integer"),
        ({"percentage": 101}, "cohorts[0].percentage: Input should be less than or equal to 100"),
        ({"cohort": 7}, "cohorts[0].cohort: Input should be a valid string"),
    ],
)
def test_types_are_checked_not_coerced(change: dict[str, Any], says: str) -> None:
    body = json.loads(_served().model_dump_json())
    body["cohorts"][0].update(change)
    with pytest.raises(ValueError, match=r"^not a canary snapshot") as info:
        SnapshotIn.parse(body)
    assert says in str(info.value)


@pytest.mark.parametrize(
    "body", [[1], "x", None, {"pack": "turnout"}, {"kill_switch": {"engaged": "no"}, "cohorts": []}]
)
def test_what_is_not_a_snapshot_is_a_value_error(body: Any) -> None:
    with pytest.raises(ValueError, match=r"^not a canary snapshot"):
        SnapshotIn.parse(body)


def test_the_oracles_own_shape() -> None:
    snap = CanarySnapshot({"x": CohortState(True, 40)}, kill_switch=True)
    assert OracleSnapshotIn.model_validate(snap.to_json()).to_snapshot() == snap
    with pytest.raises(ValueError):
        OracleSnapshotIn.model_validate({"cohorts": {"x": {"enabled": "true"}}})


def test_the_event_keeps_its_wire_keys() -> None:
    config = from_spec({"architecture": "Qwen3ForCausalLM"})
    decision = decide(config, pack=load_pack("turnout"))
    data = event_from_decision(
        decision, config, pack="turnout", deployment_id="d", at=AT, event_id="e1", host="h"
    )
    assert set(data) == {
        "event_id",
        "at",
        "deployment_id",
        "host",
        "pack",
        "family",
        "runner",
        "mode",
        "stage",
        "reason_code",
        "rule_ids",
        "policy_digest",
        "config",
        "demo",
    }
    assert data["at"] == "2026-11-30T10:00:00Z" and json.dumps(data)
    assert EventIn.model_validate(data) == decision_event(
        decision, config, pack="turnout", deployment_id="d", at=AT, event_id="e1", host="h"
    )


def test_a_launch_part_is_optional_and_bounded() -> None:
    """``turnout launch`` adds how it started vLLM; an event without it is as it was."""
    config = from_spec({"architecture": "Qwen3ForCausalLM"})
    decision = decide(config, pack=load_pack("turnout"))
    launch = LaunchIn(
        vllm_version="0.31.0",
        vllm_pack="vllm-0.31",
        env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
        snapshot_source="disk",
        startup=StartupIn(runner="v1", line="INFO Starting to load model x..."),
    )
    data = event_from_decision(
        decision, config, pack="turnout", deployment_id="d", at=AT, event_id="e1", launch=launch
    )
    assert data["launch"]["startup"]["runner"] == "v1" and data["launch"]["has_pack"] is True
    assert EventIn.model_validate(data).launch == launch
    plain = event_from_decision(decision, config, pack="turnout", deployment_id="d", at=AT)
    assert "launch" not in plain and EventIn.model_validate(plain).launch is None
    for bad in (
        {"env": {"not a name": "1"}},
        {"snapshot_source": "cache"},
        {"startup": {"runner": "v3", "line": ""}},
        {"extra": 1},
        {"env": {f"V{i}": "1" for i in range(17)}},
    ):
        with pytest.raises(ValueError):
            LaunchIn.model_validate({**launch.model_dump(), **bad})


def test_an_unplaceable_deployment_reports_the_unknown_family() -> None:
    config = from_spec({"architecture": "NoSuchForCausalLM"})
    decision = decide(config, pack=load_pack("turnout"))
    assert decision.family is None
    event = decision_event(decision, config, pack="turnout", deployment_id="d")
    assert event.family == "unknown"


def test_deployment_inputs() -> None:
    assert DeploymentIn.model_validate({"command": "vllm serve x"}).command == "vllm serve x"
    for bad in (
        {},
        {"command": "a", "argv": ["b"]},
        {"argv": ["a", 1]},
        {"env": {"A": 1}, "argv": []},
    ):
        with pytest.raises(ValueError):
            DeploymentIn.model_validate(bad)
    line = CommandsFileLine.model_validate(
        {"id": "r1", "source": "x.md", "env": {}, "argv": ["vllm", "serve", "m"]}
    )
    assert (line.id, line.argv) == ("r1", ["vllm", "serve", "m"])
    with pytest.raises(ValueError, match="recipe"):
        CommandsFileLine.model_validate({"argv": [], "recipe": 1})


def test_the_service_uses_these_models() -> None:
    from turnout.dashboard.api import schemas
    from turnout.oracle import wire

    for name in (
        "CanariesOut",
        "CohortOut",
        "KillSwitchOut",
        "EventIn",
        "IngestIn",
        "DeploymentIn",
    ):
        assert getattr(schemas, name) is getattr(wire, name), name
