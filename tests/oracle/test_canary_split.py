"""Percentage canaries are sticky: a deployment in the share stays in when it grows."""

from __future__ import annotations

from turnout.oracle import CanarySnapshot, CohortState, DeploymentConfig, decide, load_pack
from turnout.oracle.policy import bucket


def _v2_ids(percentage: int, ids: list[str]) -> set[str]:
    pack = load_pack("turnout")
    snap = CanarySnapshot({"llama-mistral-dense": CohortState(True, percentage)})
    out = set()
    for dep in ids:
        d = decide(
            DeploymentConfig(architecture="LlamaForCausalLM", deployment_id=dep),
            pack=pack,
            canaries=snap,
        )
        if d.runner == "v2":
            assert d.reason_code in ("SPLIT", "TARGETING_MATCH")
            out.add(dep)
    return out


def test_percentages_only_ever_add_deployments() -> None:
    ids = [f"fleet-{i}" for i in range(400)]
    previous: set[str] = set()
    for pct in (0, 1, 5, 10, 25, 50, 75, 99, 100):
        now = _v2_ids(pct, ids)
        assert previous <= now, f"{sorted(previous - now)} left V2 at {pct}%"
        previous = now
    assert previous == set(ids)


def test_share_is_close_to_the_percentage() -> None:
    ids = [f"dep-{i}" for i in range(2000)]
    share = len(_v2_ids(30, ids)) / len(ids)
    assert 0.26 < share < 0.34


def test_bucket_is_stable_and_per_stage() -> None:
    assert bucket("a", "dep-1") == bucket("a", "dep-1")
    assert 0 <= bucket("a", "dep-1") < 10000
    assert len({bucket(s, "dep-1") for s in ("a", "b", "c", "d")}) > 1


def test_snapshot_is_hashable_and_round_trips() -> None:
    snap = CanarySnapshot({"x": CohortState(True, 40)}, kill_switch=True)
    again = CanarySnapshot.from_json(snap.to_json())
    assert snap == again and hash(snap) == hash(again) and snap.digest == again.digest
    pack = load_pack("turnout")
    assert pack.policy_digest(snap) != pack.policy_digest(None)


def test_cohorts_describe_the_stages() -> None:
    cohorts = load_pack("turnout").cohorts
    assert [c.id for c in cohorts][:3] == [
        "qwen3-canary",
        "llama-mistral-dense",
        "qwen-deepseek-moe",
    ]
    assert cohorts[0].enabled and cohorts[0].families == ("qwen3",)
    assert cohorts[-1].id == "all-families" and not cohorts[-1].enabled
