"""Build a ``VllmConfig`` from a turnout spec, as vLLM's argument handling would hand it over.

The spec's values are what ``VllmConfig`` receives (after ``EngineArgs`` resolved the command
line: a model-specific MTP name is already ``mtp``), not what ``__post_init__`` makes of them:
``compilation_mode=stock_torch_compile`` with ``enforce_eager=true`` is both, as a user gave
them, and :mod:`referee.replay` applies vLLM's normalisation. Sub-configs are vLLM's classes,
so a value they refuse (``enable_elastic_ep`` without ``enable_eplb``) raises their own error.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from referee.architectures import model_facts
from referee.registry import RENAMED_DRAFT_METHODS, renamed, without_pp
from referee.replay import (
    NO_EXPERTS,
    _v,
    classes_without_pp,
    pooling_only_classes,
    registered_architectures,
)

# spec value -> vLLM enum name
_MODES = {
    "none": "NONE",
    "stock_torch_compile": "STOCK_TORCH_COMPILE",
    "dynamo_trace_once": "DYNAMO_TRACE_ONCE",
    "vllm_compile": "VLLM_COMPILE",
}
_PLATFORMS = {
    "cuda": "CUDA",
    "rocm": "ROCM",
    "cpu": "CPU",
    "xpu": "XPU",
    "tpu": "TPU",
    "unspecified": "UNSPECIFIED",
}
# The hidden size assumed when a spec gives none: large enough that vLLM's sequence-parallel
# threshold heuristic keeps a requested SP on (compilation/passes/fusion/sequence_parallelism.py).
DEFAULT_HIDDEN_SIZE = 8192
DEFAULT_CAPABILITY = "9.0"  # an H100/H200, where a spec names no device


def make_platform(spec: dict[str, Any]) -> Any:
    """A ``Platform`` of the spec's enum that answers device queries from the spec."""
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    name = spec.get("platform", "cuda")
    major, minor = (
        int(p) for p in str(spec.get("device_capability") or DEFAULT_CAPABILITY).split(".")
    )
    static_graphs = name in ("cuda", "rocm", "xpu")  # each platform's support_static_graph_mode

    class SpecPlatform(Platform):
        _enum = getattr(PlatformEnum, _PLATFORMS[name])
        device_name = name
        device_type = {"rocm": "cuda"}.get(name, name)  # RocmPlatform.device_type is "cuda"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(major, minor) if name in ("cuda", "rocm") else None

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return static_graphs

        @classmethod
        def device_count(cls) -> int:  # assumption: a node with enough devices
            return 1024

    return SpecPlatform()


# ParallelConfig values that shape what its __post_init__ derives (world size, the default
# executor backend), the all2all backend (the removed pplx and naive fall back to
# allgather_reducescatter there) and the EPLB switches, whose refusals the packs model (EPLB
# off CUDA/ROCm(/XPU), without expert parallelism, without any TP/PCP/DP:
# config/parallel.py _validate_parallel_config), go through the constructor and its
# validators. The other feature flags are assigned after construction, as the selection code
# reads them. Of ParallelConfig's checks of them, DCP dividing TP is restated below (the packs
# model it); a DCP that fits no PCP layout and elastic EP are not modelled yet and run in
# python -m referee serve-check only.
_SHAPE = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "prefill_context_parallel_size",
    "distributed_executor_backend",
    "enable_expert_parallel",
    "enable_eplb",
    "all2all_backend",
)
_FLAGS = (
    "decode_context_parallel_size",
    "enable_elastic_ep",
    "enable_dbo",
    "ubatch_size",
    "enable_batch_sharded_sampling",
)


def _parallel(spec: dict[str, Any]) -> Any:
    from vllm.config import ParallelConfig

    pc = ParallelConfig(**{k: spec[k] for k in _SHAPE if spec.get(k) is not None})
    for key in _FLAGS:
        if spec.get(key) is not None:
            object.__setattr__(pc, key, spec[key])
    tp, dcp = pc.tensor_parallel_size, pc.decode_context_parallel_size
    pcp = pc.prefill_context_parallel_size
    if pcp == 1 and tp % dcp != 0:
        # Restated from config/parallel.py _validate_parallel_config (0.29: line 553; the same
        # text through 0.33): "DCP reuses the TP ranks when PCP is disabled".
        raise ValueError(f"tp_size={tp} must be divisible by dcp_size={dcp}.")
    if pcp > 1 and dcp not in (1, pcp, tp * pcp):
        # Restated from the same function (0.29: line 554, 0.33: line 601, the same text)
        raise ValueError(
            "When PCP is enabled, DCP must be disabled, span the PCP "
            "axis, or span the full TP x PCP axis. "
            f"Got TP={tp}, PCP={pcp}, DCP={dcp}; valid DCP sizes are "
            f"{sorted({1, pcp, tp * pcp})}."
        )
    return pc


def _compilation(spec: dict[str, Any]) -> Any:
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    kwargs: dict[str, Any] = {}
    if spec.get("compilation_mode") is not None:
        kwargs["mode"] = getattr(CompilationMode, _MODES[spec["compilation_mode"]])
    if spec.get("cudagraph_mode") is not None:
        kwargs["cudagraph_mode"] = getattr(CUDAGraphMode, spec["cudagraph_mode"].upper())
    if spec.get("enable_sequence_parallelism"):
        kwargs["pass_config"] = {"enable_sp": True}
    return CompilationConfig(**kwargs)


def _cache(spec: dict[str, Any], facts: dict[str, Any]) -> Any:
    """``CacheConfig`` as ``create_engine_config`` builds it: prefix caching left unset takes
    the model's support (EngineArgs._set_default_chunked_prefill_and_prefix_caching_args,
    ``ModelConfig.is_prefix_caching_supported``): off for an attention-free or an
    encoder-decoder generative model. A pooling model's support depends on its pooler, which
    a spec does not give; none of them has Mamba layers, the only ones it matters to."""
    from vllm.config import CacheConfig

    kwargs = {
        k: spec[k]
        for k in ("mamba_cache_mode", "enable_prefix_caching", "kv_sharing_fast_prefill")
        if spec.get(k) is not None
    }
    if spec.get("enable_prefix_caching") is None and facts["runner_kind"] != "pooling":
        kwargs["enable_prefix_caching"] = not (
            facts["attention_free"] or facts["is_encoder_decoder"]
        )
    return CacheConfig(**kwargs)


def _model(spec: dict[str, Any], facts: dict[str, Any]) -> Any:
    """The facts of ``ModelConfig`` that the selection and the replayed steps read."""
    arch = spec.get("architecture") or "LlamaForCausalLM"
    pooling = facts["runner_kind"] == "pooling"
    hf = SimpleNamespace(model_type=arch.lower())
    if facts["has_index_topk"]:
        hf.index_topk = 2048
    hidden = spec.get("hidden_size") or DEFAULT_HIDDEN_SIZE
    return SimpleNamespace(
        architecture=arch,
        architectures=[arch],
        runner_type="pooling" if pooling else "generate",
        convert_type="none",
        pooler_config=SimpleNamespace() if pooling else None,
        is_hybrid=facts["is_hybrid"],
        has_inner_state=facts["has_inner_state"],
        is_attention_free=facts["attention_free"],
        is_multimodal_model=facts["is_multimodal"],
        is_encoder_decoder=facts["is_encoder_decoder"],
        is_diffusion=facts["is_diffusion"],
        use_mla=facts["use_mla"],
        is_moe=facts["is_moe"],
        supports_mamba_prefix_caching=facts["supports_mamba_prefix_caching"],
        multimodal_config=SimpleNamespace(
            mm_encoder_only=bool(spec.get("mm_encoder_only")), language_model_only=False
        )
        if facts["is_multimodal"] or spec.get("mm_encoder_only")
        else None,
        enforce_eager=bool(spec.get("enforce_eager")),
        logits_processors=list(spec.get("logits_processors") or []) or None,
        hf_config=hf,
        hf_text_config=hf,
        max_model_len=4096,
        dtype=_bf16(),
        disable_cascade_attn=False,
        is_mm_prefix_lm=False,
        enable_sleep_mode=False,
        quantization=None,
        return_sampling_mask=False,
        enable_trace_replay=False,
        max_logprobs=20,
        is_submodel_config=False,
        get_hidden_size=lambda: hidden,
    )


def _bf16() -> Any:
    import torch

    return torch.bfloat16


def _speculative(spec: dict[str, Any], release: str) -> Any:
    from vllm.config import SpeculativeConfig

    method = spec.get("speculative_method", "none")
    if method == "none":
        return None
    _check_method(method)
    _check_draft_runner(spec, method)
    _check_draft_registered(spec, method)
    _check_draft_parallel(spec, method, release)
    cfg = object.__new__(SpeculativeConfig)
    values = {
        "method": method,
        "num_speculative_tokens": spec.get("num_speculative_tokens") or 1,
        "parallel_drafting": bool(spec.get("parallel_drafting")),
        "enable_adaptive_verification": bool(spec.get("enable_adaptive_verification")),
        "disable_padded_drafter_batch": bool(spec.get("disable_padded_drafter_batch")),
        "use_heterogeneous_vocab": bool(spec.get("use_heterogeneous_vocab")),
        "draft_lm_head_quantization": spec.get("draft_lm_head_quantization"),
        "draft_model_config": _draft(spec),
        "draft_sample_method": "greedy",
        "tensor_parallel_size": None,
        "rejection_sample_method": "standard",
        "synthetic_acceptance_rates": None,
        "synthetic_acceptance_length": None,
        "dynamic_speculative_config": None,
    }
    for key, value in values.items():
        object.__setattr__(cfg, key, value)
    return cfg


def _check_method(method: str) -> None:
    """The release's ``SpeculativeMethod`` Literal, validated by pydantic as the
    ``SpeculativeConfig`` field is (0.33 dropped medusa and mlp_speculator). Raises ValueError
    with the text the real config's ValidationError gives (its location is ``method``)."""
    import pydantic
    from vllm.config import speculative

    try:
        pydantic.TypeAdapter(speculative.SpeculativeMethod).validate_python(method)
    except pydantic.ValidationError as exc:
        raise ValueError(f"method: {exc.errors()[0]['msg']}") from None


def _check_draft_runner(spec: dict[str, Any], method: str) -> None:
    """``ModelConfig.__post_init__`` of the MTP draft (config/model.py:655 of 0.29, the same
    text through 0.33): without a draft model, ``SpeculativeConfig.__post_init__`` builds the
    draft's ModelConfig from the target with ``runner="draft"``, which a pooling-only model
    class refuses. Restated: the raise; the class facts come from the release
    (:func:`referee.replay.pooling_only_classes`)."""
    if (
        method == "mtp"
        and spec.get("draft_architecture") is None
        and spec.get("architecture") in pooling_only_classes()
    ):
        raise ValueError(
            "Embedding models do not support `--runner draft`. "
            "Use `--runner pooling` or `--runner auto` for embedding models."
        )


# The methods whose draft model gets a ModelConfig of its own (config/speculative.py of 0.29,
# SpeculativeConfig.__post_init__'s last branch; the generator's draft architectures stand for
# real drafts of these methods).
DRAFT_MODEL_METHODS = ("draft_model", *RENAMED_DRAFT_METHODS)


def _check_draft_registered(spec: dict[str, Any], method: str) -> None:
    """The draft's architecture must be registered, before and after ``EAGLEConfig`` renames
    it (``SpeculativeConfig.__post_init__``, config/speculative.py:1238 and 1340-1358 of 0.29,
    the same through 0.33; the rename is the release's own ``EAGLEConfig``, the registry the
    release's own ``ModelRegistry``). Restated: the raise of
    ``_ModelRegistry._raise_for_unsupported`` (model_executor/models/registry.py:1172 of 0.29,
    the same text through 0.33), which ``inspect_model_cls`` reaches for a name it lacks."""
    arch = spec.get("draft_architecture")
    if arch is None or method not in DRAFT_MODEL_METHODS:
        return
    registered = registered_architectures()
    names = [arch]
    if arch in registered and method in RENAMED_DRAFT_METHODS:
        names = [renamed(arch, method)]
    if any(name not in registered for name in names):
        raise ValueError(
            f"Model architectures {names} are not supported for now. "
            f"Supported architectures: dict_keys({list(registered)!r})"
        )


# The methods whose draft config is the target's own (config/speculative.py of 0.30,
# SpeculativeConfig.__post_init__: draft_model_config = target_model_config), and those whose
# draft is a head that has no experts.
TARGET_DRAFT_METHODS = ("ngram", "ngram_gpu", "custom_class", "extract_hidden_states")
HEAD_DRAFT_METHODS = ("medusa", "mlp_speculator")


def _check_draft_parallel(spec: dict[str, Any], method: str, release: str) -> None:
    """``draft_model_config.verify_with_parallel_config(draft_parallel_config)``
    (``SpeculativeConfig.__post_init__``, config/speculative.py:1749 of 0.29, 1815 of 0.30),
    whose parallel config ``create_draft_parallel_config`` builds: in 0.29 with the target's
    pipeline size (a draft class without ``SupportsPP`` is refused, the class facts from the
    release: referee.registry), from 0.30 with pipeline size 1 and the target's expert
    parallelism (a draft without experts is refused). Restated: the raises of
    ``ModelConfig.verify_with_parallel_config`` (config/model.py:1421-1432 of 0.29)."""
    arch = spec.get("draft_architecture")
    if method in TARGET_DRAFT_METHODS:  # the target's config with the target's own layout
        heads, tp = spec.get("num_attention_heads"), spec.get("tensor_parallel_size") or 1
        if heads is not None and heads % tp != 0:
            raise ValueError(
                f"Total number of attention heads ({heads}) must be divisible by tensor "
                f"parallel size ({tp})."
            )
        if spec.get("enable_expert_parallel") and not _target_is_moe(spec):
            raise ValueError(NO_EXPERTS)
        if (spec.get("pipeline_parallel_size") or 1) > 1 and (
            spec.get("architecture") or "LlamaForCausalLM"
        ) in classes_without_pp():  # config/model.py:1425 of 0.29 (SupportsPP), same text
            raise NotImplementedError(
                "Pipeline parallelism is not supported for this model. "
                "Supported models implement the `SupportsPP` interface."
            )
        return
    if _v(release) < (0, 30):
        if (spec.get("pipeline_parallel_size") or 1) > 1 and arch is not None:
            if method in RENAMED_DRAFT_METHODS and arch in registered_architectures():
                name = renamed(arch, method)
                lacking = name in registered_architectures() and name in without_pp((name,))
            else:
                lacking = method == "draft_model" and arch in classes_without_pp()
            if lacking:
                raise NotImplementedError(
                    "Pipeline parallelism is not supported for this model. "
                    "Supported models implement the `SupportsPP` interface."
                )
        return
    # From 0.31 the draft's layout keeps expert parallelism only for a draft with experts
    # (create_draft_parallel_config, config/speculative.py:1767 of 0.31).
    if (
        spec.get("enable_expert_parallel")
        and _v(release) < (0, 31)
        and (
            (
                method in DRAFT_MODEL_METHODS
                and arch is not None
                and spec.get("draft_is_moe") is False
            )
            or method in HEAD_DRAFT_METHODS
        )
    ):
        raise ValueError(NO_EXPERTS)


def _target_is_moe(spec: dict[str, Any]) -> bool:
    return bool(model_facts(spec).get("is_moe"))


def _draft(spec: dict[str, Any]) -> Any:
    """The draft model's facts the selection reads: its architecture and layer types."""
    arch, mixed = spec.get("draft_architecture"), bool(spec.get("draft_mixed_attention"))
    if arch is None and not mixed:
        return None
    layers = ["sliding_attention", "full_attention"] if mixed else ["full_attention"]
    return SimpleNamespace(
        architectures=[arch] if arch else [], hf_config=SimpleNamespace(layer_types=layers)
    )


def _check_feature_supported(spec: dict[str, Any]) -> None:
    """``EngineArgs._check_feature_supported`` (engine/arg_utils.py of 0.29-0.33, called by
    ``create_engine_config`` right after the model config): the release's own method, on the
    two attributes it reads. Raises its NotImplementedError (pipeline parallelism with the
    uniprocess executor)."""
    from types import SimpleNamespace

    from vllm.engine.arg_utils import EngineArgs

    EngineArgs._check_feature_supported(  # type: ignore[arg-type]
        SimpleNamespace(
            pipeline_parallel_size=spec.get("pipeline_parallel_size") or 1,
            distributed_executor_backend=spec.get("distributed_executor_backend"),
        )
    )


def build_config(spec: dict[str, Any], facts: dict[str, Any], release: str) -> Any:
    """The ``VllmConfig`` the selection runs on (not yet normalised by ``__post_init__``).

    Raises the sub-config classes' own ``ValueError`` (pydantic's ValidationError) for values
    vLLM refuses before it gets to the selection.
    """
    from vllm.config import (
        AttentionConfig,
        KVTransferConfig,
        LoRAConfig,
        SchedulerConfig,
        VllmConfig,
    )

    _check_feature_supported(spec)
    cfg = object.__new__(VllmConfig)
    _defaults(cfg, VllmConfig)
    model = _model(spec, facts)
    # In create_engine_config's order: CacheConfig, then ParallelConfig, then the speculative
    # config (engine/arg_utils.py, 0.29: lines 2089, 2332, 2387); each may refuse.
    parts: dict[str, Any] = {
        "cache_config": _cache(spec, facts),
        "parallel_config": _parallel(spec),
        "compilation_config": _compilation(spec),
        "scheduler_config": SchedulerConfig(
            max_model_len=4096,
            max_num_batched_tokens=8192,
            is_encoder_decoder=facts["is_encoder_decoder"],
            **(
                {"async_scheduling": spec["async_scheduling"]}
                if spec.get("async_scheduling") is not None
                else {}
            ),
        ),
        "attention_config": AttentionConfig(
            **({"hisparse_config": {}} if spec.get("hisparse") else {})
        ),
        "lora_config": LoRAConfig() if spec.get("lora") else None,
        "watermark_config": _watermark() if spec.get("watermark") else None,
        "kv_transfer_config": KVTransferConfig(**spec["kv_transfer_config"])
        if spec.get("kv_transfer_config")
        else None,
        "speculative_config": _speculative(spec, release),
        "model_config": model,
        "optimization_level": _o2(),
    }
    for key, value in parts.items():
        object.__setattr__(cfg, key, value)
    return cfg


def _defaults(cfg: Any, cls: Any) -> None:
    """Every field of ``VllmConfig`` at its own default (default_factory included), as the
    dataclass constructor would set them; the spec's parts replace some afterwards."""
    import dataclasses

    for f in dataclasses.fields(cls):
        if f.name == "device_config":  # DeviceConfig() asks torch for the platform's device
            from vllm.platforms import current_platform

            object.__setattr__(
                cfg,
                f.name,
                SimpleNamespace(
                    device_type=current_platform.device_type, device=current_platform.device_type
                ),
            )
            continue
        factory = f.default_factory
        if factory is not dataclasses.MISSING:
            value = factory()
        else:
            value = f.default
            inner = getattr(value, "default_factory", None)
            if callable(inner):  # a pydantic Field(default_factory=...)
                value = inner()
            elif hasattr(value, "default") and type(value).__name__ == "FieldInfo":
                value = value.default
        object.__setattr__(cfg, f.name, value)


def _watermark() -> Any:
    from vllm.config import WatermarkConfig

    return WatermarkConfig(key=0)


def _o2() -> Any:
    from vllm.config.vllm import OptimizationLevel

    return OptimizationLevel.O2
