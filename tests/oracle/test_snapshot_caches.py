"""Decisions are cached per canary snapshot; many hypothetical snapshots (the service's impact
preview asks for one per cohort x percentage) must not keep a cache each forever."""

from __future__ import annotations

from turnout.oracle import CanarySnapshot, CohortState, DeploymentConfig, decide, load_pack
from turnout.oracle.pack import MAX_SNAPSHOT_CACHES


def test_caches_of_many_snapshots_stay_bounded_and_answers_stay_right() -> None:
    pack = load_pack("turnout")
    configs = [
        DeploymentConfig(architecture="LlamaForCausalLM", deployment_id=f"dep-{i}")
        for i in range(50)
    ]
    live = CanarySnapshot({"llama-mistral-dense": CohortState(True, 30)})
    first = [decide(c, pack=pack, canaries=live) for c in configs]
    for pct in range(101):
        snap = CanarySnapshot({"llama-mistral-dense": CohortState(True, pct)})
        for c in configs:
            d = decide(c, pack=pack, canaries=snap)
            assert (d.runner == "v2") == (d.canary is not None and d.canary.included)
        assert len(pack._caches) <= MAX_SNAPSHOT_CACHES
    assert [decide(c, pack=pack, canaries=live) for c in configs] == first
    assert len(pack._caches) <= MAX_SNAPSHOT_CACHES
