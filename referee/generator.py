"""Seeded deployment configs for the referee: every dimension the releases read, and their mixes.

A case is a spec in turnout's format (the field names of :class:`oracle.DeploymentConfig`, as
``turnout decide --spec`` reads them). Most fields stay at their defaults; each case changes a
few, drawn with weights that favour the dimensions vLLM's selection reads and their
interactions (two or three blockers at once, a pin against a blocker, a platform default
against a feature only one runner has), and the runner variable is set to a pin or to a value
vLLM refuses in a share of the cases. The same ``(seed, release)`` always gives the same cases;
a different seed gives different ones, which is how a pack is checked on configs nobody tuned
it on (``python -m referee check``).

Pure standard library: the generator runs with or without vLLM installed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from referee.architectures import ARCHITECTURE_POOL, SPECIAL_ARCHITECTURES

ENV_VAR = "VLLM_USE_V2_MODEL_RUNNER"
# What users put in the variable: pins, and values vLLM's int() parse refuses or reads oddly.
ENV_VALUES = ("0", "1", "0", "1", "true", "false", "yes", "", "2", "-1", " 1", "01", "1.0", "on")

# Fields a release first has, and the last release that has them (the generator leaves them
# out of the cases of releases without them; those releases' packs refuse them by name).
FIELDS_SINCE: dict[str, str] = {
    "draft_lm_head_quantization": "0.33",
    "watermark": "0.30",
    "hisparse": "0.30",
}
FIELDS_UNTIL: dict[str, str] = {
    "enable_sequence_parallelism": "0.31",  # 0.32 removed the sequence-parallel pass
}
# Dimensions that interact in the selection; a share of the cases draws two or three from one
# theme, so that their combinations (DBO with each of its limits, a speculative method with
# its flags, compile settings with graph modes) are not left to chance.
THEMES: tuple[tuple[str, ...], ...] = (
    (
        "enable_dbo",
        "ubatch_size",
        "lora",
        "speculative_method",
        "pipeline_parallel_size",
        "prefill_context_parallel_size",
        "decode_context_parallel_size",
        "is_multimodal",
        "is_encoder_decoder",
        "is_hybrid",
        "cudagraph_mode",
        "mm_encoder_only",
        "all2all_backend",
    ),
    (
        "speculative_method",
        "parallel_drafting",
        "enable_adaptive_verification",
        "disable_padded_drafter_batch",
        "use_heterogeneous_vocab",
        "draft_lm_head_quantization",
        "draft_architecture",
        "draft_mixed_attention",
        "async_scheduling",
    ),
    (
        "compilation_mode",
        "cudagraph_mode",
        "enforce_eager",
        "platform",
        "lora",
        "runner_kind",
        "is_encoder_decoder",
        "prefill_context_parallel_size",
    ),
    (
        "mamba_cache_mode",
        "enable_prefix_caching",
        "is_hybrid",
        "supports_mamba_prefix_caching",
        "mm_encoder_only",
    ),
    (
        "hisparse",
        "kv_transfer_config",
        "has_index_topk",
        "platform",
        "pipeline_parallel_size",
        "decode_context_parallel_size",
        "cudagraph_mode",
    ),
    (
        "async_scheduling",
        "pipeline_parallel_size",
        "distributed_executor_backend",
        "speculative_method",
        "platform",
        "enable_dbo",
        "all2all_backend",
        "runner_kind",
    ),
    (
        "enable_sequence_parallelism",
        "tensor_parallel_size",
        "hidden_size",
        "platform",
        "device_capability",
    ),
)

Draw = Callable[[random.Random], Any]


def _choice(*values: Any) -> Draw:
    return lambda r: r.choice(values)


def _true(_: random.Random) -> bool:
    return True


# Draft architectures: the ones some release's selection names, and real drafts (a registered
# decoder, an EAGLE-3 head) whose renamed forms some releases register and some do not.
DRAFT_ARCHITECTURES = (
    "DFlash2DraftModel",
    "DFlash2BeamDraftModel",
    "LiLiCorrDraftModel",
    "Qwen3XPressModel",
    "DFlashQwen3XPressModel",
    "ParseAuxMTPModel",
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "LlamaForCausalLMEagle3",
)
# field -> (weight, draw of a non-default value)
DIMENSIONS: dict[str, tuple[float, Draw]] = {
    "platform": (3.0, _choice("rocm", "rocm", "cpu", "cpu", "xpu", "tpu")),
    "triton_available": (1.5, lambda r: False),
    "device_capability": (0.6, _choice("8.0", "8.9", "9.0", "10.0", "12.0")),
    "speculative_method": (
        4.0,
        _choice(
            "ngram",
            "ngram_gpu",
            "suffix",
            "medusa",
            "mlp_speculator",
            "draft_model",
            "eagle",
            "eagle3",
            "mtp",
            "dflash",
            "dspark",
            "extract_hidden_states",
            "custom_class",
        ),
    ),
    "parallel_drafting": (1.2, _true),
    "enable_adaptive_verification": (0.8, _true),
    "mm_encoder_only": (0.6, _true),
    "disable_padded_drafter_batch": (0.6, _true),
    "use_heterogeneous_vocab": (0.6, _true),
    "draft_lm_head_quantization": (0.5, _choice("fp8", "nvfp4")),
    "draft_architecture": (0.8, _choice(*DRAFT_ARCHITECTURES)),
    "draft_mixed_attention": (0.6, _true),
    "draft_is_moe": (0.5, _choice(False, True)),
    "tensor_parallel_size": (2.0, _choice(2, 4, 8)),
    "pipeline_parallel_size": (2.5, _choice(2, 2, 4)),
    "data_parallel_size": (0.8, _choice(2, 4)),
    "prefill_context_parallel_size": (1.5, _choice(2, 2, 4)),
    "decode_context_parallel_size": (1.0, _choice(2, 4)),
    "enable_expert_parallel": (0.8, _true),
    "enable_eplb": (0.5, _true),
    "enable_elastic_ep": (1.0, _true),
    "enable_batch_sharded_sampling": (0.8, _true),
    "all2all_backend": (
        0.5,
        _choice(
            "deepep_low_latency",
            "deepep_high_throughput",
            "nixl_ep",
            "allgather_reducescatter",
            "naive",
            "pplx",
            "flashinfer_all2allv",
            "mori_low_latency",
        ),
    ),
    "distributed_executor_backend": (2.0, _choice("mp", "ray", "uni", "external_launcher")),
    "enable_sequence_parallelism": (1.5, _true),
    "enable_dbo": (2.0, _true),
    "ubatch_size": (1.0, _choice(1, 2, 4)),
    "compilation_mode": (
        2.5,
        _choice("none", "stock_torch_compile", "stock_torch_compile", "dynamo_trace_once"),
    ),
    "cudagraph_mode": (
        1.5,
        _choice("none", "piecewise", "full", "full_decode_only", "full_and_piecewise"),
    ),
    "enforce_eager": (1.5, _true),
    "async_scheduling": (2.0, _choice(True, False)),
    "lora": (1.0, _true),
    "hisparse": (1.0, _true),
    "watermark": (1.0, _true),
    "mamba_cache_mode": (1.5, _choice("align", "all", "all")),
    "enable_prefix_caching": (0.8, _choice(False, True)),
    "kv_sharing_fast_prefill": (0.8, _true),
    "logits_processors": (0.8, lambda r: ["example_pkg.procs:BanTokens"]),
    "logits_processor_plugins": (0.6, lambda r: ["example_plugin"]),
    "kv_transfer_config": (
        0.8,
        lambda r: r.choice(
            [
                {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                {"kv_connector": "HiSparseConnector", "kv_role": "kv_both"},
                {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_producer"},
                # in older releases' recipes, registered in none of 0.29-0.33
                {"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"},
            ]
        ),
    ),
    "hidden_size": (0.8, _choice(2048, 4096, 7168, 8192, 12288)),
    "runner_kind": (0.8, _choice("pooling")),
    "is_multimodal": (0.4, _choice(True, False)),
    "is_encoder_decoder": (0.3, _choice(True, False)),
    "is_hybrid": (0.4, _choice(True, False)),
    "is_diffusion": (0.5, _choice(True, False)),
    "use_mla": (0.3, _choice(True, False)),
    "is_moe": (0.3, _choice(True, False)),
    "has_index_topk": (0.3, _choice(True, False)),
    "supports_mamba_prefix_caching": (0.3, _choice(True, False)),
}
# How many fields a case changes (besides the architecture and the runner variable).
_NUM_CHANGED = (0, 1, 1, 2, 2, 2, 3, 3, 4, 5)


def _known(field: str, release: str) -> bool:
    since, until = FIELDS_SINCE.get(field), FIELDS_UNTIL.get(field)
    return (since is None or _version(release) >= _version(since)) and (
        until is None or _version(release) <= _version(until)
    )


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def generate(seed: int, count: int, release: str) -> Iterator[dict[str, Any]]:
    """``count`` cases ``{"id", "config"}`` for ``release`` ("0.31"), reproducible by seed."""
    rng = random.Random(f"turnout-referee:{release}:{seed}")
    names = [f for f in DIMENSIONS if _known(f, release)]
    weights = [DIMENSIONS[f][0] for f in names]
    for i in range(count):
        yield {"id": f"s{seed}-{i:05d}", "config": _case(rng, names, weights)}


def _case(rng: random.Random, names: list[str], weights: list[float]) -> dict[str, Any]:
    spec: dict[str, Any] = {"architecture": _architecture(rng)}
    for field in _pick(rng, names, weights, rng.choice(_NUM_CHANGED)):
        spec[field] = DIMENSIONS[field][1](rng)
    if rng.random() < 0.35:
        theme = [f for f in rng.choice(THEMES) if f in names]
        for field in rng.sample(theme, min(len(theme), rng.choice((2, 2, 3)))):
            spec[field] = DIMENSIONS[field][1](rng)
    _keep_plausible(rng, spec)
    roll = rng.random()
    if roll < 0.30:
        spec["env"] = {ENV_VAR: rng.choice(("0", "1"))}
    elif roll < 0.36:
        spec["env"] = {ENV_VAR: rng.choice(ENV_VALUES)}
    return spec


def _architecture(rng: random.Random) -> str:
    if rng.random() < 0.35:
        return rng.choice(SPECIAL_ARCHITECTURES)
    return rng.choice(ARCHITECTURE_POOL)


def _pick(rng: random.Random, names: list[str], weights: list[float], n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        field = rng.choices(names, weights)[0]
        if field not in out:
            out.append(field)
    return out


def _keep_plausible(rng: random.Random, spec: dict[str, Any]) -> None:
    """Make most cases ones vLLM's config classes accept, keeping some that they refuse."""
    method = spec.get("speculative_method")
    if method is not None and rng.random() < 0.7:
        spec["num_speculative_tokens"] = rng.choice((1, 2, 3, 5))
    spec_only = (
        "parallel_drafting",
        "enable_adaptive_verification",
        "disable_padded_drafter_batch",
        "use_heterogeneous_vocab",
        "draft_lm_head_quantization",
        "draft_architecture",
        "draft_mixed_attention",
        "draft_is_moe",
    )
    if method is None and any(f in spec for f in spec_only) and rng.random() < 0.8:
        spec["speculative_method"] = rng.choice(
            ("eagle", "eagle3", "mtp", "dspark", "dflash", "draft_model")
        )
    if spec.get("enable_elastic_ep") and rng.random() < 0.8:
        spec["enable_eplb"] = True
        spec["enable_expert_parallel"] = True
    if spec.get("enable_eplb") and rng.random() < 0.8:
        spec["enable_expert_parallel"] = True
    if spec.get("prefill_context_parallel_size", 1) > 1 and rng.random() < 0.25:
        spec["data_parallel_size"] = 2  # refused with PCP: ParallelConfig, later each platform
    dcp = spec.get("decode_context_parallel_size", 1)
    if dcp > 1 and rng.random() < 0.8:
        spec["tensor_parallel_size"] = max(spec.get("tensor_parallel_size", 1), dcp)
    if spec.get("enable_batch_sharded_sampling") and method is not None and rng.random() < 0.3:
        spec["enable_adaptive_verification"] = True  # refused with it, with TP 1 or more
        if rng.random() < 0.5:
            spec.pop("tensor_parallel_size", None)
    elif spec.get("enable_batch_sharded_sampling") and rng.random() < 0.7:
        spec.setdefault("tensor_parallel_size", rng.choice((2, 4)))
    if spec.get("enable_dbo") and spec.get("platform") == "rocm" and rng.random() < 0.5:
        spec["all2all_backend"] = "deepep_high_throughput"
        if rng.random() < 0.5:
            spec["async_scheduling"] = True
    elif spec.get("enable_dbo"):
        # Microbatching runs only on DeepEP / NIXL-EP backends (and, on ROCm from 0.33,
        # allgather_reducescatter, the default): mostly one of those, sometimes one it refuses.
        roll = rng.random()
        if roll < 0.6:
            spec["all2all_backend"] = rng.choice(
                ("deepep_low_latency", "deepep_high_throughput", "nixl_ep")
            )
        elif roll < 0.75:
            spec["all2all_backend"] = rng.choice(("flashinfer_all2allv", "mori_low_latency"))
    if (
        method in ("draft_model", "eagle", "eagle3", "dflash")
        and "draft_architecture" not in spec
        and rng.random() < 0.3
    ):  # a draft model's facts, as a real draft's config.json gives them
        real = method in ("eagle", "eagle3") and rng.random() < 0.7  # what EAGLE heads name
        spec["draft_architecture"] = rng.choice(
            DRAFT_ARCHITECTURES[-3:] if real else DRAFT_ARCHITECTURES
        )
        spec["draft_is_moe"] = rng.random() < 0.3
        roll = rng.random()  # the draft is verified with the target's parallel layout
        if roll < 0.2:
            spec["enable_expert_parallel"] = True
        elif roll < 0.35:
            spec["pipeline_parallel_size"] = 2
    kv = spec.get("kv_transfer_config") or {}
    if kv.get("kv_connector") == "NixlConnector" and rng.random() < 0.5:
        # NIXL's layout asserts (VllmConfig.__post_init__): DCP against TP or max(TP, PCP),
        # on MLA models (else refused), hybrid ones in 0.29
        spec["decode_context_parallel_size"] = rng.choice((2, 4))
        spec["tensor_parallel_size"] = rng.choice((2, 4, 8))
        roll = rng.random()
        if roll < 0.25:
            spec["prefill_context_parallel_size"] = rng.choice((2, 4, 8))
        elif roll < 0.4:  # PCP wider than TP, DCP spanning TP x PCP: NIXL's size is PCP
            spec.update(tensor_parallel_size=2, prefill_context_parallel_size=4)
            spec["decode_context_parallel_size"] = 8
        spec["use_mla"] = rng.random() < 0.7
        spec["is_hybrid"] = rng.random() < 0.2
    if spec.get("draft_architecture") and method is None and rng.random() < 0.8:
        spec["speculative_method"] = rng.choice(("dflash", "dflash", "draft_model"))
