"""Property tests over random deployments (hypothesis), for both shipped packs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from turnout.oracle import (
    CanarySnapshot,
    CohortState,
    DeploymentConfig,
    decide,
    explain,
    from_spec,
    load_pack,
)
from turnout.oracle.config import FIELD_INFO, FIELDS
from turnout.oracle.errors import ErrorCode

PACKS = {name: load_pack(name) for name in ("turnout", "vllm-0.31")}
ARCHS = sorted(PACKS["turnout"].architectures)
PIN_VALUES = [None, "0", "1", "true", "2", ""]


def _field_strategy(name: str, kind: str, vocab: tuple[str, ...] | None) -> Any:
    if name == "architecture":
        return st.sampled_from([*ARCHS[::7], "UnknownForCausalLM", None])
    if name in ("deployment_id",):
        return st.one_of(st.none(), st.text("abcdef0123456789-", min_size=1, max_size=8))
    if kind in ("bool", "opt_bool"):
        return st.sampled_from([None, False, True] if kind == "opt_bool" else [False, True])
    if kind == "enum":
        return st.sampled_from(list(vocab or ()))
    if kind == "int":
        return st.sampled_from([1, 2, 4]) if name.endswith("_size") else st.sampled_from([0, 3])
    if kind == "float":
        return st.sampled_from([0.0, 2.0])
    if kind == "list":
        return st.sampled_from([(), ("pkg.mod:Proc",)])
    return None


_SKIP = {"model", "model_type", "family", "env", "architecture", "deployment_id"}
_FIELD_STRATEGIES = {
    f.name: s
    for f in FIELDS
    if f.name not in _SKIP and (s := _field_strategy(f.name, f.kind, f.vocab)) is not None
}


@st.composite
def configs(draw: st.DrawFn) -> DeploymentConfig:
    fields = {
        name: draw(strat)
        for name, strat in _FIELD_STRATEGIES.items()
        if draw(st.integers(0, 3)) == 0
    }  # most fields stay at their defaults
    fields["architecture"] = draw(_field_strategy("architecture", "str", None))
    fields["deployment_id"] = draw(_field_strategy("deployment_id", "str", None))
    pin = draw(st.sampled_from(PIN_VALUES))
    if pin is not None:
        var = draw(st.sampled_from(["TURNOUT_USE_V2_MODEL_RUNNER", "VLLM_USE_V2_MODEL_RUNNER"]))
        fields["env"] = {var: pin}
    return DeploymentConfig(**fields)


def _interpreted_mask(pack_name: str, cfg: DeploymentConfig) -> list[str]:
    """The rules whose conditions hold, evaluated by Condition.test (not the generated code)."""
    pack = PACKS[pack_name]
    data = pack.data
    arch = data.archs[cfg.architecture]  # type: ignore[index]
    raw = cfg.env.get(pack.env_var)
    pin = {"0": "v1", "1": "v2"}.get(raw.strip(), "auto") if raw is not None else "auto"

    def value(dim: str) -> Any:
        if dim == "family":
            return arch.family
        if dim == "quantized":
            return cfg.quantization != "none"
        if dim == "runner_pin":
            return pin
        if dim == "pooling":
            rk = cfg.runner_kind if cfg.runner_kind is not None else arch.runner_kind
            return rk == "pooling"
        if dim in ("kv_connector", "kv_role"):
            return cfg.kv_transfer_config.get(dim) if cfg.kv_transfer_config else None
        if dim in data.derived_conditions:
            return any(
                all(c.test(value(c.dim)) for c in alt) for alt in data.derived_conditions[dim]
            )
        v = getattr(cfg, dim)
        return getattr(arch, dim) if v is None and hasattr(arch, dim) else v

    return [r.id for r in data.rules if all(c.test(value(c.dim)) for c in r.conditions)]


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("pack_name", sorted(PACKS))
@SETTINGS
@given(cfg=configs())
def test_decide_never_raises_and_is_deterministic(pack_name: str, cfg: DeploymentConfig) -> None:
    pack = PACKS[pack_name]
    d = decide(cfg, pack=pack)
    again = decide(from_spec(cfg.to_spec()), pack=pack)
    assert d == again
    json.dumps(d.to_json())
    assert d.runner in ("v1", "v2", None)
    assert (d.runner is None or d.reason_code == "ERROR") == (d.error is not None)


@pytest.mark.parametrize("pack_name", sorted(PACKS))
@SETTINGS
@given(cfg=configs())
def test_pin_to_v2_with_hard_blockers_always_errors(pack_name: str, cfg: DeploymentConfig) -> None:
    pack = PACKS[pack_name]
    if cfg.architecture not in pack.architectures or pack.data.steps:
        return  # a pack with steps decides on the normalised config: its golden file holds it
    pinned = cfg.replace(env=pack.pin_env("v2"))
    hard = {r.id for r in pack.rules if r.effect == "blocks_v2" and r.severity == "hard"}
    prereq = {r.id for r in pack.data.rules if r.prerequisite and r.error is not None}
    matched = set(_interpreted_mask(pack_name, pinned))
    d = decide(pinned, pack=pack)
    served = pack.served_architectures
    kind = cfg.runner_kind or pack.architectures[cfg.architecture].runner_kind
    if served is not None and cfg.architecture not in served.get(kind, ()):
        # No runner of the build loads it: refused before any rule (pack.manifests).
        assert d.runner is None and d.error_code == "architecture_not_served"
        assert [r.rule_id for r in d.reasons] == ["error.architecture_not_served"]
    elif matched & hard:
        assert d.runner is None and d.error is not None
        assert d.error_code == ErrorCode.PIN_CONFLICT
        # a prerequisite that fails the pin is named alone; otherwise every hard blocker is
        assert (matched & hard & prereq or matched & hard) <= {r.rule_id for r in d.reasons}
    else:
        assert d.runner == "v2" and d.mode == "pinned"


@pytest.mark.parametrize("pack_name", sorted(PACKS))
@SETTINGS
@given(cfg=configs())
def test_generated_code_agrees_with_the_conditions(pack_name: str, cfg: DeploymentConfig) -> None:
    pack = PACKS[pack_name]
    if cfg.architecture not in pack.architectures:
        return
    raw = cfg.env.get(pack.env_var)
    if raw is not None and raw.strip() not in ("0", "1"):
        return
    arch = pack.data.archs[cfg.architecture]
    pin = "auto" if raw is None else ("v2" if raw.strip() == "1" else "v1")
    mask, _, _ = pack.data.evaluate(cfg, arch, pin)
    compiled = [r.id for r in pack.data.rules if mask >> r.index & 1]
    assert compiled == _interpreted_mask(pack_name, cfg)


def _apply(
    cfg: DeploymentConfig, changes: Any, pack_name: str, canaries: CanarySnapshot | None
) -> tuple[DeploymentConfig, CanarySnapshot | None]:
    """The config and snapshot a suggestion's changes describe, built independently of
    explain() (env:NAME, kill_switch and canary:STAGE changes included)."""
    fields: dict[str, Any] = {}
    env = dict(cfg.env)
    pack = PACKS[pack_name]
    cohorts = dict(canaries.cohorts) if canaries else {}
    kill = canaries.kill_switch if canaries else pack.kill_switch
    for c in changes:
        if c.dimension.startswith("env:"):
            name = c.dimension[4:]
            if c.new is None:
                env.pop(name, None)
            else:
                env[name] = c.new
        elif c.dimension == "kill_switch":
            kill = c.new == "engaged"
        elif c.dimension.startswith("canary:"):
            assert c.new == "on 100%"
            cohorts[c.dimension[7:]] = CohortState(True, 100)
        else:
            fields[c.dimension] = c.new
    snap = CanarySnapshot(cohorts, kill_switch=kill) if (canaries or cohorts or kill) else None
    return cfg.replace(env=env, **fields), snap


SNAPSHOTS = st.one_of(
    st.none(),
    st.builds(
        lambda states, kill: CanarySnapshot(states, kill_switch=kill),
        st.dictionaries(
            st.sampled_from([c.id for c in PACKS["turnout"].cohorts]),
            st.builds(CohortState, st.booleans(), st.sampled_from([0, 1, 50, 100])),
            max_size=4,
        ),
        st.booleans(),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), canaries=SNAPSHOTS)
@example(
    cfg=DeploymentConfig(architecture="LlamaForCausalLM"),
    canaries=CanarySnapshot({}, kill_switch=True),
)
@example(
    cfg=DeploymentConfig(
        architecture="Qwen3ForCausalLM",
        speculative_method="ngram",
        env={"TURNOUT_USE_V2_MODEL_RUNNER": "0"},
    ),
    canaries=None,
)
@example(
    cfg=DeploymentConfig(architecture="LlamaForCausalLM", speculative_method="ngram"), canaries=None
)  # a blocker in a stage that is off: config change + canary or pin
@example(
    cfg=DeploymentConfig(
        architecture="LlamaForCausalLM",
        speculative_method="suffix",
        enable_dbo=True,
        env={"TURNOUT_USE_V2_MODEL_RUNNER": "0"},
    ),
    canaries=CanarySnapshot({}, kill_switch=True),
)
def test_explain_suggestions_really_reach_v2(
    cfg: DeploymentConfig, canaries: CanarySnapshot | None
) -> None:
    pack = PACKS["turnout"]
    ex = explain(cfg, pack=pack, canaries=canaries)
    for s in ex.suggestions:
        assert s.decision.runner == "v2"
        changed, snap = _apply(cfg, s.changes, "turnout", canaries)
        assert decide(changed, pack=pack, canaries=snap).runner == "v2", str(s)


def _opened(
    pack_name: str, cfg: DeploymentConfig, canaries: CanarySnapshot | None
) -> CanarySnapshot:
    """``canaries`` with the kill switch released and ``cfg``'s stage on at 100%."""
    pack = PACKS[pack_name]
    cohorts = dict(canaries.cohorts) if canaries else {}
    stage = decide(cfg, pack=pack, canaries=canaries).stage
    if stage is not None:
        cohorts[stage] = CohortState(True, 100)
    return CanarySnapshot(cohorts, kill_switch=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), canaries=SNAPSHOTS)
@example(
    cfg=DeploymentConfig(architecture="LlamaForCausalLM", speculative_method="ngram"), canaries=None
)
@example(
    cfg=DeploymentConfig(architecture="LlamaForCausalLM", enable_dbo=True),
    canaries=CanarySnapshot({}, kill_switch=True),
)
def test_explain_finds_one_change_that_needs_the_rollout_too(
    cfg: DeploymentConfig, canaries: CanarySnapshot | None
) -> None:
    """Whenever changing one option a deciding rule tested, together with opening the rollout
    for the changed deployment (its stage on at 100%, the kill switch released), reaches V2,
    explain offers a suggestion that changes at most that option, and it reaches V2."""
    pack = PACKS["turnout"]
    if cfg.architecture not in pack.architectures or pack.env_var in cfg.env:
        return
    ex = explain(cfg, pack=pack, canaries=canaries)
    if ex.decision.runner != "v1":
        return
    offered = [
        {c.dimension for c in s.changes if c.dimension in pack.domains} for s in ex.suggestions
    ]
    for dim in {d for r in ex.decision.reasons for d in r.matched}:
        if dim not in pack.domains or not FIELD_INFO[dim].changeable:
            continue
        for value in pack.domains[dim]:
            changed = cfg.replace(**{dim: value})
            opened = _opened("turnout", changed, canaries)
            if decide(changed, pack=pack, canaries=opened).runner == "v2":
                assert any(dims <= {dim} for dims in offered), (dim, value, offered)
                break
