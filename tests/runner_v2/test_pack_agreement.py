"""The turnout pack agrees with both runners' capability manifests, and with runner_v2.

- Every cell of the pack's matrix (``oracle.matrix``) that the pack sends to runner_v1 or
  runner_v2 is one that runner's manifest serves: architecture and runner kind, speculative
  method, logits processors, CPU offload, prefix caching, platform, Triton. The pack's other
  dimensions are classified below: model attributes (the architecture decides them) or options
  turnout's engine has no field for (refused by name before any runner is built).
- Every V2 blocker of the pack has a witness here: the oracle refuses its configuration when
  pinned to V2, and either runner_v2 refuses it itself with the pack's words (on CPU), or the
  engine refuses it by name before runner_v2 could be built (a speculative method
  ``SpeculativeConfig`` cannot express, a device type ``EngineConfig`` does not accept, an
  engine argument that does not exist), or when the model is loaded (``LOAD_REFUSES``: the
  witness test named there).
- The speculative methods runner_v2's manifest lists (``ngram_gpu``, ``draft_model``) are
  decided for V2, pinned or not, and runner_v2 serves each (the tests listed below).
- Every thing runner_v2's manifest serves is exercised on runner_v2 by a test (the parity
  suite runs every case on each runner of ``tests/parity/conftest.RUNNERS``):

  - `architectures`: tests/engine/test_families_served.py::test_every_family_architecture_is_served_or_refused
  - `chunked_prefill`: tests/parity/test_parity_contracts.py::test_prompt_logprobs_once_per_token_through_chunking_and_preemption
  - `logprobs`: tests/parity/test_parity_reference.py::test_greedy_tokens_and_logprobs_equal_hf
  - `prefix_caching`: tests/parity/test_parity_contracts.py::test_prefix_cache_hits_do_not_change_outputs
  - `prompt_logprobs`: tests/parity/test_parity_contracts.py::test_prompt_logprobs_once_per_token_through_chunking_and_preemption
  - `pooling_task:embed`: tests/runner_v2/test_pack_agreement.py::test_pooling_runs_on_v2
  - `pooling_task:classify`: tests/parity/test_parity_pooling.py::test_classify_equals_hf_logits
  - `pooling_task:score`: tests/parity/test_parity_pooling.py::test_cross_encoder_score_equals_hf_logits
  - `pooling_task:reward`: tests/parity/test_parity_pooling.py::test_reward_equals_hf_last_token_logits
  - `platform:cpu`: tests/runner_v2/test_pack_agreement.py::test_generation_features_run_on_v2
  - `platform:cuda`: tests/parity/test_parity_gpu.py::test_fp32_greedy_equal_hf_on_both_runners
  - `async_scheduling`: tests/runner_v2/test_runner.py::test_steps_return_async_outputs_collected_one_step_later
  - `cuda_graphs`: tests/parity/test_parity_gpu.py::test_bf16_runners_agree
  - `speculative_method:ngram_gpu`: tests/runner_v2/test_spec_decode.py::test_greedy_speculation_equals_plain_decoding
  - `speculative_method:draft_model`: tests/runner_v2/test_spec_decode.py::test_greedy_speculation_equals_plain_decoding
  - `tensor_parallel`: tests/parity/test_parity_tensor_parallel.py::test_qwen3_shape_at_tp2_equals_tp1

- ``tensor_parallel_size > 1``: a cell the pack sends to a runner is one its manifest serves at
  that size (``tensor_parallel_architectures``), or one the engine refuses by name before any
  process starts (the other families: ``engine.model.parallel_layers.tensor_parallel_problem``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from minilm_path import minilm_dir
from tiny_model_configs import TINY_DECODER_CONFIGS

pytest.importorskip("pydantic")  # the oracle

import turnout.runner_v2.refusals as refusals
from turnout import runner_v1, runner_v2
from turnout.engine.config import MAMBA_CACHE_MODES, EngineConfig, SpeculativeConfig
from turnout.engine.errors import EngineConfigError, NoRunnerError, UnsupportedOptionError
from turnout.engine.llm import LLM
from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams
from turnout.oracle import DeploymentConfig, decide, load_pack
from turnout.oracle.matrix import enumerate_matrix, scenarios
from turnout.runner_v2 import create_model_runner

ROOT = Path(__file__).resolve().parents[2]
PACK = load_pack("turnout")
MANIFESTS = {"v1": runner_v1.MANIFEST, "v2": runner_v2.MANIFEST}
V2_BLOCKERS = [r for r in PACK.rules if r.effect == "blocks_v2"]
#: Blockers runner_v2 refuses itself, as the keyword arguments of an EngineConfig (None: per
#: request, or a property of the machine).
EXPRESSIBLE = {
    "cpu_offload": {"cpu_offload_gb": 4.0},
    "ngram_speculation": {"speculative_config": SpeculativeConfig(method="ngram")},
    "custom_logits_processors": None,
    "triton_required": None,
    "cpu_platform": None,
}
#: Blockers the engine refuses by name before runner_v2 could be built: the value of their
#: dimension (speculative_method, platform) cannot be expressed in an EngineConfig.
ENGINE_REFUSES = {
    "suffix_speculation",
    "medusa_speculation",
    "mlp_speculator_speculation",
    "v2_speculation_unimplemented",
    "v2_platform_unserved",
    "mamba_cache_mode_all",
    "v2_mamba_cache_mode_unimplemented",
}
#: Blockers refused when the model is loaded (the architecture decides them), by the test that
#: witnesses the refusal on runner_v2.
LOAD_REFUSES = {
    "v2_speculation_with_recurrent_state": "tests/parity/test_parity_jamba.py::test_speculative_decoding_is_refused",
}
#: Pack dimensions checked against the manifests, and the others.
CHECKED = {
    "speculative_method",
    "logits_processors",
    "cpu_offload_gb",
    "platform",
    "triton_available",
    "pooling",
    "mamba_cache_mode",
    "tensor_parallel_size",
}
MODEL_ATTRIBUTES = {
    "family",
    "is_moe",
    "attention_free",
    "has_inner_state",
}  # facts of the architecture
# turnout's engine has no such option: EngineConfig refuses it by name. `quantization` is a
# fact of the checkpoint the engine reports (none, gguf, fp8, compressed-tensors): the manifests
# do not list weight formats yet, so it is not checked here.
NO_ENGINE_FIELD = {
    "compilation_mode",
    "enable_sequence_parallelism",
    "pipeline_parallel_size",
    "prefill_context_parallel_size",
    "distributed_executor_backend",
    "async_scheduling",
    "enable_dbo",
    "enable_elastic_ep",
    "logits_processor_plugins",
    "kv_sharing_fast_prefill",
    "quantization",
}
DERIVED = {"quantized": "quantization"}


def _witness(rule_id: str) -> dict[str, object]:
    for scenario in scenarios(PACK):
        if scenario.id == f"rule:{rule_id}":
            return dict(scenario.changes)
    # One-dimension rules have no witness column (their value is a column of its own).
    (cond,) = next(r for r in PACK.data.rules if r.id == rule_id).conditions
    default = getattr(DeploymentConfig(), cond.dim)
    for candidate in PACK.domains.get(cond.dim) or (True, False):
        if candidate != default and cond.test(candidate):
            return {cond.dim: candidate}
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
    assert {r.id for r in V2_BLOCKERS} - set(EXPRESSIBLE) - ENGINE_REFUSES - set(LOAD_REFUSES) == {
        "stock_torch_compile",
        "sequence_parallelism_with_tp",
        "external_launcher_pipeline",
        "dual_batch_overlap",
        "elastic_expert_parallel",
        "custom_logits_processor_plugins",
        "kv_sharing_fast_prefill",
    }


@pytest.mark.parametrize("rule", V2_BLOCKERS, ids=[r.id for r in V2_BLOCKERS])
def test_each_v2_blocker_is_refused(rule, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if rule.id in LOAD_REFUSES:  # a fact of the architecture: Jamba's Mamba layers
        d = decide(
            DeploymentConfig(
                architecture="JambaForCausalLM",
                speculative_method="ngram_gpu",
                env=PACK.pin_env("v2"),
            ),
            pack=PACK,
        )
        assert d.runner is None and rule.label.split("'")[0] in (d.error or "")
        path, _, name = LOAD_REFUSES[rule.id].partition("::")
        source = (ROOT / path).read_text()
        assert (
            re.search(rf"^def {name}\(", source, re.M)
            and '"v2"' in source.split(f"def {name}(")[0][-300:]
        )
        return
    witness = _witness(rule.id)
    decision = decide(_pinned_v2(**witness), pack=PACK)
    if rule.severity == "soft":
        assert decision.runner == "v2"  # a pin is allowed (vLLM's opt-in-only features)
    else:
        assert decision.runner is None and rule.label.split("{")[0] in (decision.error or "")
    base = EngineConfig(model=str(tmp_path), vocab_size=100, max_model_len=64)
    if rule.id in ENGINE_REFUSES:
        ((dim, value),) = witness.items()
        with pytest.raises(EngineConfigError, match=re.escape(repr(value))):
            if dim == "speculative_method":
                SpeculativeConfig(method=value)
            elif dim == "mamba_cache_mode":
                dataclasses.replace(base, mamba_cache_mode=value)
            else:
                assert dim == "platform"
                dataclasses.replace(base, device=value)
        return
    if rule.id not in EXPRESSIBLE:
        # The engine cannot express the configuration: some dimension of it is no engine
        # argument (sequence parallelism's; its tensor_parallel_size is one).
        unknown = [dim for dim in witness if dim in NO_ENGINE_FIELD]
        assert unknown, rule.id
        for dim in unknown:
            with pytest.raises(EngineConfigError, match=f"unknown engine arguments \\['{dim}'\\]"):
                EngineConfig.check_field_names({dim})
        return
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


def test_every_method_the_engine_expresses_and_v2_lacks_is_refused(tmp_path: Path) -> None:
    from turnout.engine.config import SUPPORTED_SPECULATIVE_METHODS

    base = EngineConfig(model=str(tmp_path), vocab_size=100, max_model_len=64)
    lacking = set(SUPPORTED_SPECULATIVE_METHODS) - set(runner_v2.MANIFEST.speculative_methods)
    assert lacking == {"ngram"}
    for method in sorted(lacking):
        spec = SpeculativeConfig(method=method)
        with pytest.raises(EngineConfigError, match=f"speculative method '{method}'"):
            create_model_runner(dataclasses.replace(base, speculative_config=spec))


@pytest.mark.parametrize("method", sorted(runner_v2.MANIFEST.speculative_methods))
def test_the_methods_v2_serves_are_decided_for_v2(method: str) -> None:
    assert set(runner_v2.MANIFEST.speculative_methods) == {"ngram_gpu", "draft_model"}
    for arch in ("Qwen3ForCausalLM", "LlamaForCausalLM"):  # a stage on, a stage off
        for env in ({}, PACK.pin_env("v2")):
            cfg = DeploymentConfig(
                architecture=arch, speculative_method=method, num_speculative_tokens=3, env=env
            )
            assert decide(cfg, pack=PACK).runner == "v2", (arch, env)
        pinned = decide(
            DeploymentConfig(architecture=arch, speculative_method=method, env=PACK.pin_env("v1")),
            pack=PACK,
        )
        assert (
            pinned.runner is None
            and pinned.error == f"Model Runner V1 does not support: speculative method '{method}'"
        )


def test_v1_refuses_the_device_methods_in_the_packs_words(tmp_path: Path) -> None:
    base = EngineConfig(model=str(tmp_path), vocab_size=100, max_model_len=64)
    for method in ("ngram_gpu", "draft_model"):
        spec = SpeculativeConfig(
            method=method, model=str(tmp_path) if method == "draft_model" else None
        )
        want = decide(
            DeploymentConfig(
                architecture="Qwen3ForCausalLM", speculative_method=method, env=PACK.pin_env("v1")
            ),
            pack=PACK,
        ).error
        with pytest.raises(EngineConfigError) as err:
            runner_v1.create_model_runner(dataclasses.replace(base, speculative_config=spec))
        assert str(err.value) == want


def _unserved(runner: str, cfg: DeploymentConfig) -> list[str]:
    """What of ``cfg`` the runner's manifest does not serve (the CHECKED dimensions)."""
    m = MANIFESTS[runner]
    kind = cfg.runner_kind or PACK.architectures[cfg.architecture].runner_kind
    problems = []
    if not m.serves_architecture(cfg.architecture, kind):
        problems.append(f"architecture {cfg.architecture} ({kind})")
    if kind == "pooling" and not m.pooling_tasks:
        problems.append("pooling")
    if cfg.speculative_method != "none" and cfg.speculative_method not in m.speculative_methods:
        problems.append(f"speculative_method {cfg.speculative_method}")
    if cfg.logits_processors and not m.honours("logits_processors"):
        problems.append("logits_processors")
    if cfg.cpu_offload_gb > 0 and not m.honours("cpu_offload"):
        problems.append("cpu_offload")
    if cfg.enable_prefix_caching and not m.honours("prefix_caching"):
        problems.append("prefix_caching")
    if cfg.platform not in m.platforms:
        problems.append(f"platform {cfg.platform}")
    # engine/runner_setup.py refuses speculation for models with Mamba layers on both runners
    if cfg.speculative_method != "none" and PACK.architectures[cfg.architecture].has_inner_state:
        problems.append(f"speculative_method {cfg.speculative_method} with Mamba layers")
    if MAMBA_CACHE_MODES.get(cfg.mamba_cache_mode or "none") != "honoured":
        problems.append(f"mamba_cache_mode {cfg.mamba_cache_mode}")
    if not cfg.triton_available and m.requires_triton:
        problems.append("Triton")
    if (
        cfg.tensor_parallel_size > 1
        and cfg.architecture not in m.tensor_parallel_architectures
        and _tensor_parallel_refusal(cfg.architecture, cfg.tensor_parallel_size) is None
    ):
        problems.append(
            f"tensor_parallel_size {cfg.tensor_parallel_size}"
        )  # neither served nor refused
    return problems


def _tensor_parallel_refusal(architecture: str, size: int) -> str | None:
    """The engine's refusal of ``architecture`` at ``size`` ranks (for any head counts), or None."""
    from turnout.engine.model import ModelConfig
    from turnout.engine.model.parallel_layers import tensor_parallel_problem

    config = ModelConfig(
        architecture=architecture,
        vocab_size=64 * size,
        hidden_size=64 * size,
        intermediate_size=64 * size,
        num_hidden_layers=1,
        num_attention_heads=size,
        num_key_value_heads=size,
        head_dim=64,
        max_position_embeddings=64,
    )
    return tensor_parallel_problem(config, size)


def test_tensor_parallel_cells_are_served_or_refused_by_name() -> None:
    for m in MANIFESTS.values():
        assert set(m.tensor_parallel_architectures) == {
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
        }
    seen = {"served": 0, "refused": 0}
    for cell in enumerate_matrix(PACK):
        cfg, runner = cell.config, cell.decision.runner
        if runner is None or cfg.tensor_parallel_size == 1:
            continue
        refusal = _tensor_parallel_refusal(cfg.architecture, cfg.tensor_parallel_size)
        served = cfg.architecture in MANIFESTS[runner].tensor_parallel_architectures
        assert served == (refusal is None), cfg.architecture
        if refusal is not None:
            assert (
                refusal.startswith(f"tensor_parallel_size={cfg.tensor_parallel_size}: ")
                and cfg.architecture in refusal
            )
        seen["served" if served else "refused"] += 1
    assert seen["served"] and seen["refused"]  # both kinds of cell exist


def test_every_cell_the_pack_sends_to_a_runner_is_served_by_its_manifest() -> None:
    sent = {"v1": 0, "v2": 0}
    wrong = []
    for cell in enumerate_matrix(PACK):
        runner = cell.decision.runner
        if runner is None:
            continue
        sent[runner] += 1
        problems = _unserved(runner, cell.config)
        if problems:
            wrong.append(
                f"{cell.architecture} pin={cell.pin} {cell.scenario.id} -> {runner}: {problems}"
            )
    assert not wrong, f"{len(wrong)} cells, e.g.\n" + "\n".join(wrong[:20])
    assert sent["v1"] > 100 and sent["v2"] > 100  # the check is not vacuous
    # ... and it would catch a pack that sends an unserved feature: V2 honours no offload.
    assert _unserved("v2", DeploymentConfig(architecture="LlamaForCausalLM", cpu_offload_gb=4)) == [
        "cpu_offload"
    ]


def test_every_pack_dimension_is_checked_or_classified() -> None:
    dims = set(PACK.domains)
    assert dims == CHECKED | MODEL_ATTRIBUTES | NO_ENGINE_FIELD | set(DERIVED), (
        f"classify {sorted(dims - CHECKED - MODEL_ATTRIBUTES - NO_ENGINE_FIELD - set(DERIVED))}; "
        f"gone: {sorted(CHECKED | MODEL_ATTRIBUTES | NO_ENGINE_FIELD | set(DERIVED) - dims)}"
    )
    for dim in sorted(NO_ENGINE_FIELD):
        with pytest.raises(EngineConfigError, match=f"unknown engine arguments \\['{dim}'\\]"):
            EngineConfig.check_field_names({dim})


def test_the_docstring_lists_a_v2_test_for_everything_v2_serves() -> None:
    m = runner_v2.MANIFEST
    want = {
        "architectures",
        *m.honoured,
        *(f"pooling_task:{t}" for t in m.pooling_tasks),
        *(f"platform:{p}" for p in m.platforms),
        *(f"speculative_method:{s}" for s in m.speculative_methods),
    }
    want |= {name for name in ("async_scheduling", "cuda_graphs") if getattr(m, name)}
    want |= {"tensor_parallel"} if m.tensor_parallel_architectures else set()
    listed = dict(re.findall(r"^  - `([\w:.-]+)`: (\S+)$", __doc__ or "", re.M))
    assert set(listed) == want
    for feature, ref in listed.items():
        path, _, name = ref.partition("::")
        text = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", text, re.M), f"{feature}: no {ref}"
        if path.startswith("tests/parity/") and "gpu" not in path:
            assert "runner_name" in text.split(f"def {name}(")[1].split(")")[0], ref
    runners = re.search(
        r"^RUNNERS = \[(.*)\]$", (ROOT / "tests/parity/conftest.py").read_text(), re.M
    )
    assert runners is not None and '"v2"' in runners.group(1)


def test_blockers_are_all_listed_at_once(tmp_path: Path) -> None:
    config = EngineConfig(
        model=str(tmp_path),
        vocab_size=100,
        max_model_len=64,
        cpu_offload_gb=1.0,
        speculative_config=SpeculativeConfig(method="ngram"),
    )
    want = decide(_pinned_v2(cpu_offload_gb=1.0, speculative_method="ngram"), pack=PACK).error
    with pytest.raises(EngineConfigError) as err:
        create_model_runner(config)
    assert sorted(str(err.value).split(": ", 1)[1].split(", ")) == sorted(
        (want or "").split(": ", 1)[1].split(", ")
    )


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v2-qwen3")
    write_random_weights(TINY_DECODER_CONFIGS["qwen3"], path, dtype=torch.float32, seed=5)
    return path


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_generation_features_run_on_v2(qwen3_dir: Path, prefix_caching: bool) -> None:
    # The generate deployment on this machine with every expressible V2-supported value:
    # no speculation, no offload, no processors, prefix caching on or off.
    llm = LLM(
        qwen3_dir,
        "v2",
        device="cpu",
        max_model_len=128,
        enable_prefix_caching=prefix_caching,
        environ={},
    )
    assert llm.runner_name == "v2" and llm.core.async_scheduling
    assert {r.rule_id for r in llm.decision.reasons} >= {"pin.v2"}
    prompt = list(range(3, 40))
    outs = llm.generate(
        [prompt, [*prompt[:20], 7]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 5]
    ref = LLM(
        qwen3_dir,
        "v1",
        device="cpu",
        max_model_len=128,
        enable_prefix_caching=prefix_caching,
        environ={},
    )
    want = ref.generate(
        [prompt, [*prompt[:20], 7]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in want]


def test_pooling_runs_on_v2() -> None:
    # The pack has a pooling stage (no V2 blocker): runner_v2 embeds, as runner_v1 does.
    texts = ["a red car", "the GPU-resident request table"]
    v2 = LLM(minilm_dir(), "v2", device="cpu", environ={})
    v1 = LLM(minilm_dir(), "v1", device="cpu", environ={})
    assert v2.runner_name == "v2" and type(v2.core.runner).__module__ == "turnout.runner_v2.runner"
    got = np.stack([o.embedding for o in v2.embed(texts)])
    want = np.stack([o.embedding for o in v1.embed(texts)])
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_v2_pin_with_a_blocker_fails_at_construction(qwen3_dir: Path) -> None:
    with pytest.raises(
        NoRunnerError, match=r"Model Runner V2 does not yet support: CPU weight offload"
    ):
        LLM(qwen3_dir, "v2", device="cpu", max_model_len=128, cpu_offload_gb=0.5, environ={})
