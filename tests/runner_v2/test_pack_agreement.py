"""The turnout pack and runner_v2 agree.

- Every V2 blocker of the pack: its configuration (the rule's witness, built from the pack) is
  refused by the oracle when pinned to V2, and, where turnout's engine can express it, runner_v2
  refuses it itself with the same words; where it cannot, no engine field carries it (so nothing
  reaches runner_v2 unrefused).
- Every feature value the pack lets V2 have, among those the engine can express, runs on V2
  through ``LLM(..., runner="v2")``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from minilm_path import minilm_dir
from tiny_model_configs import TINY_DECODER_CONFIGS

pytest.importorskip("pydantic")  # the oracle

import runner_v2.refusals as refusals
from engine.config import EngineConfig, SpeculativeConfig
from engine.errors import EngineConfigError, NoRunnerError, UnsupportedOptionError
from engine.llm import LLM
from engine.model import write_random_weights
from engine.sampling_params import SamplingParams
from oracle import DeploymentConfig, decide, load_pack
from oracle.matrix import scenarios
from runner_v2 import create_model_runner

PACK = load_pack("turnout")
V2_BLOCKERS = [r for r in PACK.rules if r.effect == "blocks_v2"]
#: Blockers turnout's engine can express, as the keyword arguments of an EngineConfig (None:
#: per request, or a property of the machine).
EXPRESSIBLE = {
    "cpu_offload": {"cpu_offload_gb": 4.0},
    "ngram_speculation": {"speculative_config": SpeculativeConfig(method="ngram")},
    "custom_logits_processors": None,
    "triton_required": None,
    "cpu_platform": None,
}


def _witness(rule_id: str) -> dict[str, object]:
    for scenario in scenarios(PACK):
        if scenario.id == f"rule:{rule_id}":
            return dict(scenario.changes)
    rule = next(r for r in PACK.rules if r.id == rule_id)
    # One-dimension rules have no witness column (their value is a column of its own).
    ((dim, conds),) = rule.when.items()
    op, value = conds[0]
    domain = PACK.domains.get(dim) or (True, False)
    for candidate in domain:
        if (op == "eq" and candidate == value) or (op == "in" and candidate in value) or (
            op == "ne" and candidate != value) or (op == "gt" and candidate > value):
            return {dim: candidate}
    raise AssertionError(f"no witness for {rule_id}")


def _pinned_v2(**fields: object) -> DeploymentConfig:
    return DeploymentConfig(architecture="Qwen3ForCausalLM", env=PACK.pin_env("v2"), **fields)


def test_runner_labels_are_the_packs() -> None:
    labels = {r.id: r.label for r in PACK.rules}
    for rule_id, label in refusals.LABELS.items():
        assert labels[rule_id] == label, rule_id
    triton = next(r for r in PACK.rules if r.id == "triton_required")
    assert triton.prerequisite
    d = decide(_pinned_v2(triton_available=False), pack=PACK)
    assert d.runner is None and d.error == refusals.TRITON_REQUIRED


def test_every_blocker_is_known_to_this_test() -> None:
    # A new V2 rule in the pack must be classified here (and refused by runner_v2 if the engine
    # can express it).
    assert {r.id for r in V2_BLOCKERS} - set(EXPRESSIBLE) == {
        "stock_torch_compile", "sequence_parallelism_with_tp", "external_launcher_pipeline",
        "suffix_speculation", "medusa_speculation", "mlp_speculator_speculation", "draft_model_speculation",
        "eagle_parallel_drafting", "eagle3_pipeline_parallel", "dual_batch_overlap", "elastic_expert_parallel",
        "custom_logits_processor_plugins", "kv_sharing_fast_prefill", "mamba_cache_mode_all",
    }


@pytest.mark.parametrize("rule", V2_BLOCKERS, ids=[r.id for r in V2_BLOCKERS])
def test_each_v2_blocker_is_refused(rule, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    witness = _witness(rule.id)
    decision = decide(_pinned_v2(**witness), pack=PACK)
    if rule.severity == "soft":
        assert decision.runner == "v2"  # a pin is allowed (vLLM's opt-in-only features)
    else:
        assert decision.runner is None and rule.label.split("{")[0] in (decision.error or "")
    if rule.id not in EXPRESSIBLE:
        engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
        assert not set(witness) & engine_fields, f"{rule.id}: the engine now has {set(witness) & engine_fields}"
        return
    base = EngineConfig(model=str(tmp_path), vocab_size=100, max_model_len=64)
    if rule.id == "custom_logits_processors":
        runner = create_model_runner(base)
        with pytest.raises(UnsupportedOptionError) as err:
            runner.check_sampling_params(SamplingParams(logits_processors=[lambda ids, x: x]))
        assert str(err.value).startswith(decision.error or "")
    elif rule.id == "triton_required":
        monkeypatch.setattr(refusals, "HAS_TRITON", False)
        with pytest.raises(EngineConfigError) as err:
            create_model_runner(base)
        assert str(err.value) == decision.error
    elif rule.id == "cpu_platform":
        assert create_model_runner(base).device.type == "cpu"  # soft: runs, interpreted
    else:
        with pytest.raises(EngineConfigError) as err:
            create_model_runner(dataclasses.replace(base, **EXPRESSIBLE[rule.id]))
        assert str(err.value) == decision.error


def test_blockers_are_all_listed_at_once(tmp_path: Path) -> None:
    config = EngineConfig(model=str(tmp_path), vocab_size=100, max_model_len=64, cpu_offload_gb=1.0,
                          speculative_config=SpeculativeConfig(method="ngram"))
    want = decide(_pinned_v2(cpu_offload_gb=1.0, speculative_method="ngram"), pack=PACK).error
    with pytest.raises(EngineConfigError) as err:
        create_model_runner(config)
    assert sorted(str(err.value).split(": ", 1)[1].split(", ")) == sorted((want or "").split(": ", 1)[1].split(", "))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v2-qwen3")
    write_random_weights(TINY_DECODER_CONFIGS["qwen3"], path, dtype=torch.float32, seed=5)
    return path


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_generation_features_run_on_v2(qwen3_dir: Path, prefix_caching: bool) -> None:
    # The generate deployment on this machine with every expressible V2-supported value:
    # no speculation, no offload, no processors, prefix caching on or off.
    llm = LLM(qwen3_dir, "v2", device="cpu", max_model_len=128, enable_prefix_caching=prefix_caching, environ={})
    assert llm.runner_name == "v2" and llm.core.async_scheduling
    assert {r.rule_id for r in llm.decision.reasons} >= {"pin.v2"}
    prompt = list(range(3, 40))
    outs = llm.generate([prompt, [*prompt[:20], 7]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 5]
    ref = LLM(qwen3_dir, "v1", device="cpu", max_model_len=128, enable_prefix_caching=prefix_caching, environ={})
    want = ref.generate([prompt, [*prompt[:20], 7]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in want]


def test_pooling_runs_on_v2() -> None:
    # The pack has a pooling stage (no V2 blocker): runner_v2 embeds, as runner_v1 does.
    texts = ["a red car", "the GPU-resident request table"]
    v2 = LLM(minilm_dir(), "v2", device="cpu", environ={})
    v1 = LLM(minilm_dir(), "v1", device="cpu", environ={})
    assert v2.runner_name == "v2" and type(v2.core.runner).__module__ == "runner_v2.runner"
    got = np.stack([o.embedding for o in v2.embed(texts)])
    want = np.stack([o.embedding for o in v1.embed(texts)])
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_v2_pin_with_a_blocker_fails_at_construction(qwen3_dir: Path) -> None:
    with pytest.raises(NoRunnerError, match=r"Model Runner V2 does not yet support: CPU weight offload"):
        LLM(qwen3_dir, "v2", device="cpu", max_model_len=128, cpu_offload_gb=0.5, environ={})
