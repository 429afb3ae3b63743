"""``Pack.rule_ids``: every rule id a decision of a shipped pack carries is in it.

The service refuses decision events that name a rule id outside the pack's (the fallback
counts are keyed by rule id), so a decision whose id the set lacks would be refused from a real
engine. Checked over every cell of each pack's matrix under the canary states that bring out
each rollout reason, and over the release packs' golden configurations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnout.oracle import decide, enumerate_matrix, from_spec, load_pack
from turnout.oracle.decision import CanarySnapshot, CohortState
from turnout.oracle.errors import ConfigError
from turnout.oracle.matrix import scenarios
from turnout.oracle.paths import SHIPPED_PACKS

REFERENCE = Path(__file__).resolve().parents[2] / "policies" / "reference"


def _canary_states(pack_name: str) -> list[CanarySnapshot]:
    pack = load_pack(pack_name)
    ids = [c.id for c in pack.cohorts]
    return [
        CanarySnapshot(kill_switch=True),
        CanarySnapshot({i: CohortState(False) for i in ids}),
        CanarySnapshot({i: CohortState(True, 0) for i in ids}),
        CanarySnapshot({i: CohortState(True, 100) for i in ids}),
    ]


@pytest.mark.parametrize("name", SHIPPED_PACKS)
def test_every_reason_of_the_matrix_is_a_rule_id_of_the_pack(name: str) -> None:
    pack = load_pack(name)
    seen = {r.rule_id for cell in enumerate_matrix(pack) for r in cell.decision.reasons}
    # the rollout's reasons: the canary states on the unpinned cells of the first columns
    columns = scenarios(pack)[:12]
    for canaries in _canary_states(name):
        for cell in enumerate_matrix(pack, canaries, columns=columns, pins=("auto",)):
            seen.update(r.rule_id for r in cell.decision.reasons)
    assert seen <= pack.rule_ids, sorted(seen - pack.rule_ids)
    # the sweep reaches rules, pins and the rollout's reasons, not one kind only
    assert {"pin.v1", "pin.v2"} <= seen
    assert any(r.startswith("rollout.") for r in seen) or not pack.cohorts
    assert len(seen) > 10


@pytest.mark.parametrize("name", [p for p in SHIPPED_PACKS if p.startswith("vllm-")])
def test_every_reason_of_the_golden_configurations_is_a_rule_id(name: str) -> None:
    pack = load_pack(name)
    golden = REFERENCE / name / "golden.jsonl"
    seen: set[str] = set()
    for line in golden.read_text(encoding="utf-8").splitlines():
        try:
            config = from_spec(json.loads(line)["config"])
        except ConfigError:
            continue
        seen.update(r.rule_id for r in decide(config, pack=pack).reasons)
    assert seen <= pack.rule_ids, sorted(seen - pack.rule_ids)
    assert any(r.startswith(("error.", "select.error", "step.")) for r in seen)


def test_rule_ids_are_bounded_and_made_of_the_pack() -> None:
    pack = load_pack("turnout")
    assert {r.id for r in pack.rules} <= pack.rule_ids
    assert "rollout.kill_switch" in pack.rule_ids and "made.up" not in pack.rule_ids
    assert len(pack.rule_ids) < 1000
