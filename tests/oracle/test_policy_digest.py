"""The policy digest names the effective policy: the same effective state, the same digest."""

from __future__ import annotations

from turnout.oracle import CanarySnapshot, CohortState, DeploymentConfig, decide, load_pack


def _defaults(pack_name: str) -> CanarySnapshot:
    pack = load_pack(pack_name)
    return CanarySnapshot(
        {c.id: CohortState(c.enabled, c.percentage) for c in pack.cohorts},
        kill_switch=pack.kill_switch,
    )


def test_snapshot_equal_to_the_defaults_has_the_defaults_digest() -> None:
    for name in ("turnout", "vllm-0.31"):
        pack = load_pack(name)
        cfg = DeploymentConfig(architecture="LlamaForCausalLM", deployment_id="dep-1")
        none = decide(cfg, pack=pack)
        same = decide(cfg, pack=pack, canaries=_defaults(name))
        assert none.runner == same.runner
        assert none.policy_digest == same.policy_digest, name
        assert pack.policy_digest(None) == pack.policy_digest(_defaults(name))


def test_missing_and_unknown_cohorts_do_not_change_the_digest() -> None:
    pack = load_pack("turnout")
    assert pack.policy_digest(CanarySnapshot({})) == pack.policy_digest(None)
    ghost = CanarySnapshot({"no-such-cohort": CohortState(True, 5)})
    assert pack.policy_digest(ghost) == pack.policy_digest(None)
    first = pack.cohorts[0]
    only_first = CanarySnapshot({first.id: CohortState(first.enabled, first.percentage)})
    assert pack.policy_digest(only_first) == pack.policy_digest(None)


def test_any_effective_change_changes_the_digest() -> None:
    pack = load_pack("turnout")
    base = _defaults("turnout")
    seen = {pack.policy_digest(base)}
    killed = CanarySnapshot(base.cohorts, kill_switch=not base.kill_switch)
    seen.add(pack.policy_digest(killed))
    for c in pack.cohorts:
        flipped = dict(base.cohorts)
        flipped[c.id] = CohortState(not c.enabled, c.percentage)
        seen.add(pack.policy_digest(CanarySnapshot(flipped)))
        share = dict(base.cohorts)
        share[c.id] = CohortState(c.enabled, 37 if c.percentage != 37 else 38)
        seen.add(pack.policy_digest(CanarySnapshot(share)))
    assert len(seen) == 2 + 2 * len(pack.cohorts)
