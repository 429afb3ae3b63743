"""vLLM's own test cases on the runner selection and on ``VllmConfig.__post_init__``, as the
oracle decides them.

vLLM's tests/test_config.py checks, among much else, which model runner
``VllmConfig.use_v2_model_runner`` picks, how ``VLLM_USE_V2_MODEL_RUNNER`` is read, what
``__post_init__`` refuses (HiSparse, V2-only features on V1) and what it settles (async
scheduling, the compilation mode, the CUDA graph mode). Each test here transcribes one of those
cases into turnout's terms and is named after it: a real ``vllm serve`` line, read by the
oracle's own parser with the model's facts from a shipped config.json folder
(policies/reference/model_configs), from policies/known_models.yaml or from the architecture
the vLLM case names, decided with a release pack; then vLLM's expected outcome is asserted: the
runner, or a refusal whose text holds the fragment the vLLM test matches. A case that names an
architecture and no model is decided as that bare architecture.

The vLLM file these cases come from is a stored copy of the main branch after 0.33.0, newer
than every release turnout describes, so each case runs against the pack of the newest release
(0.29 ... 0.33) that has the feature it tests: vllm-0.33 unless a test says otherwise.

Where vLLM asserts a value that ``__post_init__`` settles, the value is replayed from the pack's
steps that applied to the config (:meth:`Pack.steps_applied`), in their order: the config's
own value, changed by every step that sets it. Cases on what the oracle does not model (graph
capture sizes, pass configs, optimization levels other than the default O2, Engram, the
watermark's algorithm and sampling options, pooling configs, tokenizers) are not transcribed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from referee.serve_gen import write_models
from turnout.oracle import Decision, DeploymentConfig, Message, decide, load_pack
from turnout.oracle.sources import command_to_fields

NEWEST = "0.33"
ENV_VAR = "VLLM_USE_V2_MODEL_RUNNER"
V1_PIN = {ENV_VAR: "0"}
HISPARSE = """--attention-config '{"hisparse_config": {}}'"""
MTP = """--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding each shipped model config as ``<name>/config.json``; lines name them
    as ``{models}/<name>``."""
    root = tmp_path_factory.mktemp("models")
    write_models(root)
    return root


def read_line(
    line: str,
    models: Path,
    *,
    release: str = NEWEST,
    env: dict[str, str] | None = None,
    platform: str = "cuda",
    device_capability: str = "9.0",
    architecture: str | None = None,
) -> DeploymentConfig:
    """The config of a ``vllm serve`` line as the release's parser reads it, on the given
    device (an H100 unless said; ROCm as an MI300X, capability 9.4)."""
    words = shlex.split(line.replace("{models}", str(models)))
    parsed = command_to_fields(
        words, env or {}, release=release, offline=True, architecture=architecture
    )
    fields = {**parsed.fields, "platform": platform, "device_capability": device_capability}
    return DeploymentConfig(**fields)


def decided(config: DeploymentConfig, release: str = NEWEST) -> Decision:
    return decide(config, pack=load_pack(f"vllm-{release}"))


def settled(config: DeploymentConfig, *names: str, release: str = NEWEST) -> dict[str, Any]:
    """The values of ``names`` once the release's steps have run on ``config``: its own,
    changed by each step that applied and sets them, in order."""
    pack = load_pack(f"vllm-{release}")
    applied = set(pack.steps_applied(config))
    values = {name: getattr(config, name) for name in names}
    for step in pack.data.steps:
        if step.id in applied:
            values.update((k, v) for k, v in step.sets.items() if k in values)
    return values


def assert_refused(decision: Decision, fragment: str) -> None:
    assert decision.runner is None, decision
    assert decision.error is not None and fragment in decision.error, decision.error


# -- the runner variable ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_value", "mode", "runner"),
    [(None, "auto", "v2"), ("0", "pinned", "v1"), ("1", "pinned", "v2")],
)
def test_v2_model_runner_env_tri_state(
    env_value: str | None, mode: str, runner: str, models: Path
) -> None:
    """vLLM tests/test_config.py::test_v2_model_runner_env_tri_state: the variable is unset
    (no pin: the release's own default decides), "0" (V1) or "1" (V2)."""
    env = {} if env_value is None else {ENV_VAR: env_value}
    d = decided(read_line("vllm serve {models}/qwen3-8b", models, env=env))
    assert (d.mode, d.runner, d.error) == (mode, runner, None), d


# -- HiSparse (0.30+) ---------------------------------------------------------------------------


def test_hisparse_requires_v2_model_runner(models: Path) -> None:
    """vLLM tests/test_config.py::test_hisparse_requires_v2_model_runner: HiSparse takes V2
    when the variable is unset and refuses a V1 pin."""
    line = f"vllm serve deepseek-ai/DeepSeek-V3.2 {HISPARSE}"
    assert decided(read_line(line, models)).runner == "v2"
    assert_refused(decided(read_line(line, models, env=V1_PIN)), "requires Model Runner V2")


def test_hisparse_rejects_decode_context_parallelism(models: Path) -> None:
    """vLLM tests/test_config.py::test_hisparse_rejects_decode_context_parallelism"""
    line = f"vllm serve deepseek-ai/DeepSeek-V3.2 {HISPARSE} -tp 2 -dcp 2"
    assert_refused(decided(read_line(line, models)), "decode context parallelism")


def test_hisparse_rejects_pipeline_parallelism(models: Path) -> None:
    """vLLM tests/test_config.py::test_hisparse_rejects_pipeline_parallelism"""
    line = f"vllm serve deepseek-ai/DeepSeek-V3.2 {HISPARSE} -pp 2"
    assert_refused(decided(read_line(line, models)), "pipeline parallelism")


def test_hisparse_rejects_non_cuda(models: Path) -> None:
    """vLLM tests/test_config.py::test_hisparse_rejects_non_cuda (here on ROCm)"""
    line = f"vllm serve deepseek-ai/DeepSeek-V3.2 {HISPARSE}"
    config = read_line(line, models, platform="rocm", device_capability="9.4")
    assert_refused(decided(config), "requires NVIDIA CUDA")


# -- the DSA models: ROCm's V1 default, breakable CUDA graphs -----------------------------------


@pytest.mark.parametrize(
    "model",
    ["deepseek-ai/DeepSeek-V3.2", "deepseek-ai/DeepSeek-V4-Flash", "zai-org/GLM-5.2-FP8"],
)
def test_rocm_keeps_compiled_deepseek_defaults(model: str, models: Path) -> None:
    """vLLM tests/test_config.py::test_rocm_keeps_compiled_deepseek_defaults: on ROCm,
    DeepSeek-V3.2, DeepSeek-V4 and GLM-5 default to V1, and DeepSeek-V3.2 and GLM-5 keep their
    compiled graphs (no breakable CUDA graphs). Against vllm-0.31: 0.32 and 0.33 dropped the
    ROCm V1 default (ROCM_DEFAULT_MRV1_ARCHITECTURES) that vLLM's main branch has again."""
    config = read_line(
        f"vllm serve {model}", models, release="0.31", platform="rocm", device_capability="9.4"
    )
    d = decided(config, "0.31")
    assert (d.runner, d.error) == ("v1", None), d
    if config.architecture != "DeepseekV4ForCausalLM":  # the vLLM test asks of these two
        mode = settled(config, "compilation_mode", release="0.31")
        assert mode == {"compilation_mode": "vllm_compile"}


@pytest.mark.parametrize(
    ("model", "architecture"),
    [
        ("nvidia/GLM-5.2-NVFP4", "GlmMoeDsaForCausalLM"),
        ("zai-org/GLM-5.2-FP8", "GlmMoeDsaForCausalLM"),
        ("nvidia/DeepSeek-V3.2-NVFP4", "DeepseekV32ForCausalLM"),
    ],
)
@pytest.mark.parametrize("with_mtp", [False, True], ids=["no-mtp", "mtp"])
def test_dsa_models_default_to_mrv2_and_breakable_cudagraph(
    model: str, architecture: str, with_mtp: bool, models: Path
) -> None:
    """vLLM tests/test_config.py::test_dsa_models_default_to_mrv2_and_breakable_cudagraph: on
    CUDA the DSA models take V2, with or without MTP, and breakable CUDA graphs: compilation
    off, the piecewise graphs of FULL_AND_PIECEWISE kept."""
    line = (
        f"""vllm serve {model} --compilation-config '{{"cudagraph_mode": "FULL_AND_PIECEWISE"}}'"""
    )
    if with_mtp:
        line += f" {MTP}"
    config = read_line(line, models, architecture=architecture)
    assert config.architecture == architecture
    d = decided(config)
    assert (d.mode, d.runner, d.error) == ("auto", "v2", None), d
    assert settled(config, "compilation_mode", "cudagraph_mode") == {
        "compilation_mode": "none",
        "cudagraph_mode": "full_and_piecewise",
    }


@pytest.mark.parametrize(
    ("architecture", "is_rocm", "expected"),
    [
        ("DeepseekV32ForCausalLM", False, True),
        ("DeepseekV32ForCausalLM", True, False),
        ("GlmMoeDsaForCausalLM", False, True),
        ("GlmMoeDsaForCausalLM", True, False),
        ("Qwen4ExpForCausalLM", False, True),
        ("Qwen4ExpForCausalLM", True, False),
        ("Qwen4ExpForConditionalGeneration", False, True),
        ("Qwen4ExpForConditionalGeneration", True, False),
    ],
)
def test_breakable_cudagraph_platform_default(
    architecture: str, is_rocm: bool, expected: bool
) -> None:
    """vLLM tests/test_config.py::test_breakable_cudagraph_platform_default: these
    architectures get breakable CUDA graphs (compilation turned off) on CUDA, not on ROCm.
    (Its MTP draft classes, DeepseekV32MTPModel and Qwen4ExpMTP, are not served models.)"""
    platform, capability = ("rocm", "9.4") if is_rocm else ("cuda", "9.0")
    config = DeploymentConfig(
        architecture=architecture, platform=platform, device_capability=capability
    )
    assert decided(config).error is None
    mode = settled(config, "compilation_mode")["compilation_mode"]
    assert (mode == "none") is expected, mode


# -- speculative decoding -----------------------------------------------------------------------


def test_v2_model_runner_supports_extract_hidden_states(models: Path) -> None:
    """vLLM tests/test_config.py::test_v2_model_runner_supports_extract_hidden_states: nothing
    of the config keeps V2 away."""
    spec = '{"method": "extract_hidden_states", "num_speculative_tokens": 1}'
    d = decided(
        read_line(f"vllm serve {{models}}/qwen3-0.6b --speculative-config '{spec}'", models)
    )
    assert (d.runner, d.error) == ("v2", None), d
    assert not [r for r in d.reasons if r.effect == "blocks_v2"], d.reasons


@pytest.mark.parametrize(
    ("method", "draft", "dflash2"),
    [
        ("dflash", "DFlash2DraftModel", True),
        ("dflash", "DFlashDraftModel", False),
        (None, None, False),
    ],
    ids=["dflash2-draft", "dflash1-draft", "no-speculation"],
)
def test_dflash2_draft_forces_v2_model_runner(
    method: str | None, draft: str | None, dflash2: bool, models: Path, tmp_path: Path
) -> None:
    """vLLM tests/test_config.py::test_dflash2_draft_forces_v2_model_runner: a DFlash draft
    whose config.json names DFlash2DraftModel is kept from V1 (it takes V2, a V1 pin is
    refused); a DFlash1 draft, or no speculation, is not. (Its cases of an EAGLE method with a DFlash2 class and of a DFlash method
    without a draft config are predicates on partial objects, not lines.)"""
    line = "vllm serve {models}/qwen3-8b"
    if method is not None and draft is not None:
        folder = tmp_path / "draft"
        folder.mkdir()
        facts = {"architectures": [draft], "model_type": "qwen3"}
        (folder / "config.json").write_text(json.dumps(facts), encoding="utf-8")
        spec = {"method": method, "model": str(folder), "num_speculative_tokens": 3}
        line += f" --speculative-config '{json.dumps(spec)}'"
    auto = decided(read_line(line, models))
    assert (auto.runner, auto.error) == ("v2", None), auto
    assert [r.rule_id for r in auto.reasons if r.effect == "blocks_v1"] == (
        ["dflash_candidate_head"] if dflash2 else []
    )
    pinned = decided(read_line(line, models, env=V1_PIN))
    if dflash2:
        assert_refused(pinned, "DFlash candidate-head drafts")
    else:
        assert (pinned.runner, pinned.error) == ("v1", None), pinned


def test_eagle_draft_model_config(models: Path) -> None:
    """vLLM tests/test_config.py::test_eagle_draft_model_config: an EAGLE draft whose
    config.json names LlamaForCausalLM (as EAGLE-LLaMA3-Instruct-8B's does) is renamed
    EagleLlamaForCausalLM, a class the release registers, so the line starts (here the draft
    folder is the shipped Llama-3.1-8B config)."""
    spec = '{"method": "eagle", "model": "{models}/llama-3.1-8b", "num_speculative_tokens": 1}'
    config = read_line(f"vllm serve {{models}}/llama-3.1-8b --speculative-config '{spec}'", models)
    assert config.draft_architecture == "LlamaForCausalLM"
    d = decided(config)
    assert (d.runner, d.error) == ("v2", None), d


# -- CUDA graph and compilation modes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "platform", "capability"),
    [
        ("--runner pooling --convert embed", "cuda", "9.0"),
        ("-pcp 2 -tp 2", "rocm", "9.4"),  # vLLM runs this one only on ROCm
    ],
    ids=["pooling", "rocm-pcp"],
)
def test_late_piecewise_restrictions_without_compilation(
    flags: str, platform: str, capability: str, models: Path
) -> None:
    """vLLM tests/test_config.py::test_late_piecewise_restrictions_without_compilation: without
    compilation, the piecewise graphs a pooling model (or ROCm with prefill context
    parallelism) falls back to are dropped too: no CUDA graphs at all."""
    env = {ENV_VAR: "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}  # the latter: not a runner variable
    line = f"vllm serve {{models}}/opt-125m -cc.mode=NONE {flags}"
    config = read_line(line, models, env=env, platform=platform, device_capability=capability)
    d = decided(config)
    assert (d.runner, d.error) == ("v2", None), d
    assert settled(config, "cudagraph_mode") == {"cudagraph_mode": "none"}


@pytest.mark.parametrize(
    ("line", "architecture", "compilation_mode", "cudagraph_mode"),
    [
        ("vllm serve Qwen/Qwen1.5-7B", "Qwen2ForCausalLM", "vllm_compile", "full_and_piecewise"),
        ("vllm serve {models}/deepseek-v2-lite", None, "vllm_compile", "full_and_piecewise"),
        (
            "vllm serve RedHatAI/Llama-3.2-1B-FP8 --quantization compressed-tensors",
            "LlamaForCausalLM",
            "vllm_compile",
            "full_and_piecewise",
        ),
        (
            "vllm serve RedHatAI/Llama-3.2-1B-FP8 --quantization compressed-tensors "
            """--compilation-config '{"cudagraph_mode": "NONE", """
            """"pass_config": {"enable_qk_norm_rope_fusion": true}}'""",
            "LlamaForCausalLM",
            "vllm_compile",
            "none",
        ),
        (
            "vllm serve Qwen/Qwen1.5-7B -cc.pass_config.eliminate_noops=false",
            "Qwen2ForCausalLM",
            "vllm_compile",
            "full_and_piecewise",
        ),
    ],
    ids=["regular", "moe", "quantized", "explicit-cudagraph-none", "one-pass-overridden"],
)
def test_vllm_config_explicit_overrides(
    line: str,
    architecture: str | None,
    compilation_mode: str,
    cudagraph_mode: str,
    models: Path,
) -> None:
    """vLLM tests/test_config.py::test_vllm_config_explicit_overrides, its cases at the default
    optimization level O2 (the oracle reads no other level): VLLM_COMPILE and
    FULL_AND_PIECEWISE whatever the model, an explicit CUDA graph mode kept."""
    config = read_line(line, models, architecture=architecture)
    assert decided(config).error is None
    assert settled(config, "compilation_mode", "cudagraph_mode") == {
        "compilation_mode": compilation_mode,
        "cudagraph_mode": cudagraph_mode,
    }


# -- the default runner -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "architecture"),
    [
        ("vllm serve Qwen/Qwen3-32B", None),
        ("vllm serve Qwen/Qwen2-7B-Instruct", "Qwen2ForCausalLM"),
        ("vllm serve meta-llama/Llama-3.2-1B", "LlamaForCausalLM"),
        ("vllm serve mistralai/Mistral-7B-v0.1", "MistralForCausalLM"),
        ("vllm serve {models}/opt-125m", None),
        ("vllm serve google/gemma-2-2b", "Gemma2ForCausalLM"),
        ("vllm serve {models}/deepseek-v2-lite", None),  # DeepSeek-V2-Lite(-Chat)
        ("vllm serve deepseek-ai/DeepSeek-V2-Chat", "DeepseekV2ForCausalLM"),
        ("vllm serve deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM"),
        ("vllm serve deepseek-ai/DeepSeek-V4-Flash", None),
        ("vllm serve {models}/qwen1.5-moe-a2.7b", None),  # Qwen1.5-MoE-A2.7B(-Chat)
        ("vllm serve ibm-research/PowerMoE-3b", "GraniteMoeForCausalLM"),
        ("vllm serve thinkingmachines/Inkling", "InklingForCausalLM"),
        ("vllm serve thinkingmachines/Inkling", "InklingForConditionalGeneration"),
        ("vllm serve mistralai/Mixtral-8x7B-Instruct-v0.1", "MixtralForCausalLM"),
        ("vllm serve Qwen/Qwen3-1.7B-FP8 --quantization fp8", "Qwen3ForCausalLM"),
        ("vllm serve Qwen/Qwen3.5-4B", None),
        ("vllm serve {models}/mamba-130m", None),
        ("vllm serve {models}/all-minilm-l6-v2", None),
        ("vllm serve Qwen/Qwen3-Embedding-0.6B --runner pooling", "Qwen3ForCausalLM"),
    ],
)
def test_models_default_to_v2_model_runner(
    line: str, architecture: str | None, models: Path
) -> None:
    """vLLM tests/test_config.py::test_models_default_to_v2_model_runner: with the variable
    unset, on CUDA with Triton, every one of these models takes V2. (Its ColQwen3 case is
    left out: the oracle's families.yaml does not know that architecture.)"""
    config = read_line(line, models, architecture=architecture)
    if architecture is not None:
        assert config.architecture == architecture
    d = decided(config)
    assert (d.mode, d.runner, d.error) == ("auto", "v2", None), d


def test_v1_model_runner_rejects_v2_only_features(models: Path) -> None:
    """vLLM tests/test_config.py::test_v1_model_runner_rejects_v2_only_features: prefill
    context parallelism on a V1 pin is refused."""
    config = read_line("vllm serve {models}/qwen3-8b -pcp 2", models, env=V1_PIN)
    assert_refused(decided(config), "prefill context parallel")


# -- async scheduling ---------------------------------------------------------------------------


def test_async_scheduling_with_pipeline_parallelism_is_allowed(models: Path) -> None:
    """vLLM tests/test_config.py::test_async_scheduling_with_pipeline_parallelism_is_allowed:
    async scheduling asked for with pipeline parallelism on the multiprocessing executor
    stays on."""
    line = "vllm serve {models}/qwen3-8b -pp 2 --distributed-executor-backend mp --async-scheduling"
    config = read_line(line, models)
    d = decided(config)
    assert (d.runner, d.error) == ("v2", None), d
    assert settled(config, "async_scheduling") == {"async_scheduling": True}


def test_draft_model_enables_async_scheduling_by_default(models: Path) -> None:
    """vLLM tests/test_config.py::test_draft_model_enables_async_scheduling_by_default: a
    draft-model speculator leaves async scheduling on by default."""
    spec = '{"method": "draft_model", "model": "{models}/qwen3-0.6b", "num_speculative_tokens": 3}'
    line = (
        "vllm serve {models}/qwen3-0.6b --distributed-executor-backend uni "
        f"--speculative-config '{spec}'"
    )
    config = read_line(line, models)
    assert config.async_scheduling is None  # not asked for
    d = decided(config)
    assert (d.runner, d.error) == ("v2", None), d
    assert settled(config, "async_scheduling") == {"async_scheduling": True}


# -- watermarking (0.30+) -----------------------------------------------------------------------


def test_watermarking_forces_model_runner_v2(models: Path) -> None:
    """vLLM tests/test_config.py::test_watermarking_forces_model_runner_v2: watermarking
    overrides a V1 pin, saying so once at INFO."""
    line = """vllm serve {models}/qwen3-8b --watermark-config '{"key": 42}'"""
    d = decided(read_line(line, models, env=V1_PIN))
    assert (d.runner, d.error) == ("v2", None), d
    assert d.messages == (
        Message(
            "INFO",
            "Watermarking requires Model Runner V2 and overrides VLLM_USE_V2_MODEL_RUNNER=0.",
        ),
    )
