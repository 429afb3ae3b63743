"""The part of ``VllmConfig.__post_init__`` around the runner selection, in vLLM's order.

Replayed: the steps that evaluate the selection, change a value it reads, or refuse a
configuration over such values. Each step calls vLLM's own method where the step is one
(``_maybe_enable_breakable_cudagraph``, ``_apply_optimization_level_defaults``,
``_normalize_piecewise_cudagraph_mode``, ``MambaModelConfig.verify_and_update_config``,
``get_sequence_parallelism_threshold``, ``Executor.get_class``) and restates it, citing the
lines, where ``__post_init__`` does it inline. Not replayed (documented in
docs/oracle-releases.md): steps that only touch settings turnout does not model (custom ops,
KV-cache sizes, profiler, MoonEP, LoRA/model verification against the parallel layout) and the
platform hooks of TPU, which live in the separate tpu-inference package.

Line numbers cite ``vllm/config/vllm.py`` of 0.31.0; :data:`STEPS` says per step which
releases run it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from typing import Any

_EAGLE_LIKE = ("eagle", "eagle3", "mtp")  # get_args(EagleModelTypes), resolved names
_NGRAM_GPU = ("ngram_gpu",)


def _v(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


@contextlib.contextmanager
def _plugins(spec: dict[str, Any]) -> Iterator[None]:
    """``importlib.metadata.entry_points(group="vllm.logits_processors")`` as the spec says."""
    import importlib.metadata as md

    real = md.entry_points
    plugins = list(spec.get("logits_processor_plugins") or [])

    def entry_points(**kwargs: Any) -> Any:
        if kwargs.get("group") == "vllm.logits_processors":
            return [
                md.EntryPoint(name, f"{name}:Processor", "vllm.logits_processors")
                for name in plugins
            ]
        return real(**kwargs)

    md.entry_points = entry_points  # type: ignore[assignment]
    try:
        yield
    finally:
        md.entry_points = real  # type: ignore[assignment]


def _evaluate(cfg: Any, capture: Any, spec: dict[str, Any]) -> bool:
    with capture.selecting(), _plugins(spec):
        return bool(cfg.use_v2_model_runner)


@contextlib.contextmanager
def _selecting(capture: Any, spec: dict[str, Any]) -> Iterator[None]:
    with capture.selecting(), _plugins(spec):
        yield


# -- steps before the async-scheduling block ------------------------------------------------


def model_hooks(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """try_verify_and_update_config (vllm.py:2766): the Mamba hook of Mamba-family and hybrid
    models moves ``mamba_cache_mode`` with prefix caching (models/config.py MambaModelConfig)."""
    from vllm.model_executor.models.config import MambaModelConfig

    mm = cfg.model_config
    mamba_archs = ("MambaForCausalLM", "Mamba2ForCausalLM", "FalconMambaForCausalLM")
    if (
        mm.multimodal_config is not None
        and mm.multimodal_config.mm_encoder_only
        and cfg.cache_config.enable_prefix_caching
    ):
        cfg.cache_config.enable_prefix_caching = False  # vllm.py:1416
    if mm.architecture in mamba_archs or mm.is_hybrid:
        cfg.scheduler_config.enable_chunked_prefill = True
        if cfg.cache_config.mamba_block_size is None and not cfg.cache_config.enable_prefix_caching:
            cfg.cache_config.mamba_block_size = mm.max_model_len
        MambaModelConfig.verify_and_update_config(cfg)


def _executor_supports_async(cfg: Any) -> bool:
    """The release's own executor class (Ray is installed in the referee venvs): "ray" is
    RayExecutorV2, a MultiprocExecutor, unless VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (0.29-0.32;
    vllm/v1/executor/abstract.py Executor.get_class)."""
    from vllm.v1.executor.abstract import Executor

    return bool(Executor.get_class(cfg).supports_async_scheduling())


def _async_compatible_method(method: str) -> bool:
    """The release's own lists (vllm/config/speculative.py EagleModelTypes, NgramGPUTypes)."""
    from typing import get_args

    from vllm.config.speculative import EagleModelTypes, NgramGPUTypes

    allowed = set(get_args(EagleModelTypes)) | set(get_args(NgramGPUTypes))
    return method in allowed or method in ("draft_model", "dspark", "dflash")


def _v1_async_incompat(cfg: Any, capture: Any, spec: dict[str, Any]) -> str | None:
    """0.33 (vllm.py:1653): what V1 cannot combine with async scheduling, from a selection
    evaluated before anything is normalised."""
    if _evaluate(cfg, capture, spec):
        return None
    spec_cfg = cfg.speculative_config
    if spec_cfg is not None and not _async_compatible_method(spec_cfg.method):
        return f"{spec_cfg.method}-based speculative decoding"
    if spec_cfg is not None and spec_cfg.disable_padded_drafter_batch:
        return "disable_padded_drafter_batch=True"
    if cfg.parallel_config.pipeline_parallel_size > 1:
        return "pipeline parallelism"
    return None


def async_scheduling(cfg: Any, spec: dict[str, Any], release: str, capture: Any) -> None:
    """The async-scheduling block (vllm.py:1536-1635): refusals when it was asked for, else
    the default. 0.31-0.32 evaluate the selection early when PP > 1; 0.33 always does."""
    sched, spec_cfg = cfg.scheduler_config, cfg.speculative_config
    supports = _executor_supports_async(cfg)
    rocm_ht_dbo = (
        spec.get("platform") == "rocm"
        and cfg.parallel_config.enable_dbo
        and cfg.parallel_config.all2all_backend == "deepep_high_throughput"
    )
    backend = cfg.parallel_config.distributed_executor_backend
    v133 = _v(release) >= (0, 33)
    incompat = _v1_async_incompat(cfg, capture, spec) if v133 else None
    if sched.async_scheduling:
        if rocm_ht_dbo:
            raise ValueError(
                "Async scheduling is not compatible with ROCm DeepEP "
                "high-throughput DBO. Please use --no-async-scheduling or "
                "select a different all2all backend."
            )
        if v133 and incompat is not None:
            raise ValueError(
                f"Async scheduling is not supported by the V1 model runner with {incompat}."
            )
        if not v133 and spec_cfg is not None:
            if not _async_compatible_method(spec_cfg.method):
                raise ValueError(_async_only_message(release))
            if spec_cfg.disable_padded_drafter_batch:
                raise ValueError(
                    "Async scheduling is not compatible with disable_padded_drafter_batch=True."
                )
        if not supports:
            raise ValueError(f"`{backend}` does not support async scheduling yet.")
        return
    if sched.async_scheduling is not None:
        return
    if (
        cfg.model_config.runner_type == "pooling"
        or (not v133 and spec_cfg is not None and not _async_compatible_method(spec_cfg.method))
        or (not v133 and spec_cfg is not None and spec_cfg.disable_padded_drafter_batch)
        or not supports
        or rocm_ht_dbo
    ):
        sched.async_scheduling = False
    elif v133:
        sched.async_scheduling = incompat is None
    elif (
        _v(release) >= (0, 31)
        and cfg.parallel_config.pipeline_parallel_size > 1
        and not _evaluate(cfg, capture, spec)
    ):
        sched.async_scheduling = False
    else:
        sched.async_scheduling = True


def _async_only_message(release: str) -> str:
    kinds = (
        "EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash kind"
        if _v(release) >= (0, 31)
        else "EAGLE/MTP/Draft Model/NGram GPU/DSpark kind"
    )
    return f"Currently, async scheduling is only supported with {kinds} of speculative decoding"


# -- compilation and CUDA graphs --------------------------------------------------------------


def enforce_eager(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """vllm.py:1694: enforce_eager sets mode NONE and cudagraph_mode NONE; so does
    TORCH_COMPILE_DISABLE=1 for the mode (vllm.py:1714)."""
    import os

    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    cc = cfg.compilation_config
    if cfg.model_config.enforce_eager:
        cc.mode = CompilationMode.NONE
        cc.cudagraph_mode = CUDAGraphMode.NONE
    if os.environ.get("TORCH_COMPILE_DISABLE") == "1":
        cc.mode = CompilationMode.NONE


def batch_invariant(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """vllm.py:1728 (0.31+): VLLM_BATCH_INVARIANT turns sequence parallelism off."""
    import vllm.envs as envs

    pc = cfg.compilation_config.pass_config
    if envs.VLLM_BATCH_INVARIANT and (pc.enable_sp or pc.fuse_gemm_comms):
        pc.enable_sp = False
        pc.fuse_gemm_comms = False


def compile_defaults(cfg: Any, spec: dict[str, Any], release: str) -> bool:
    """Breakable CUDA graphs (vllm.py:1741, the release's own method), mode None -> the
    optimization level's (vllm.py:1775), then the level's defaults (vllm.py:1802)."""
    from vllm.config.compilation import CompilationMode
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG, OptimizationLevel

    breakable = bool(cfg._maybe_enable_breakable_cudagraph())
    cc = cfg.compilation_config
    if cc.mode is None:
        cc.mode = (
            CompilationMode.VLLM_COMPILE
            if cfg.optimization_level > OptimizationLevel.O0
            else CompilationMode.NONE
        )
    # _apply_optimization_level_defaults (vllm.py:1802) for the two values the selection
    # reads, taken from the release's own OPTIMIZATION_LEVEL_TO_CONFIG table; a value the user
    # set is kept, as _set_config_default does.
    level = OPTIMIZATION_LEVEL_TO_CONFIG[cfg.optimization_level]["compilation_config"]
    if cc.cudagraph_mode is None:
        cc.cudagraph_mode = level["cudagraph_mode"]
    sp_default = level.get("pass_config", {}).get("enable_sp")
    if getattr(cc.pass_config, "enable_sp", False) is None and sp_default is not None:
        cc.pass_config.enable_sp = sp_default(cfg) if callable(sp_default) else sp_default
    return breakable


def piecewise(cfg: Any, spec: dict[str, Any], release: str, breakable: bool) -> None:
    """Piecewise CUDA graphs need VLLM_COMPILE: 0.30+ drop to the non-piecewise mode
    (``_normalize_piecewise_cudagraph_mode``), 0.29 to NONE (its vllm.py:1468, inline)."""
    if _v(release) >= (0, 30):
        cfg._normalize_piecewise_cudagraph_mode(breakable_cudagraph_enabled=breakable)
        return
    import vllm.envs as envs
    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    cc = cfg.compilation_config
    if (
        cc.cudagraph_mode.requires_piecewise_compilation()
        and cc.mode != CompilationMode.VLLM_COMPILE
        and not envs.VLLM_USE_BREAKABLE_CUDAGRAPH
    ):
        cc.cudagraph_mode = CUDAGraphMode.NONE


# ModelConfig._verify_with_expert_parallelism's text (config/model.py:1360 of 0.29, through 0.33)
NO_EXPERTS = (
    "Number of experts in the model must be greater than 0 when expert parallelism is enabled."
)


def expert_parallel_needs_experts(cfg: Any, facts: dict[str, Any]) -> None:
    """``ModelConfig.verify_with_parallel_config`` (vllm.py:1093 of 0.29, after the model hooks
    and, in 0.30-0.31, the watermark check) calls ``_verify_with_expert_parallelism``
    (config/model.py:1360 of 0.29, the same text through 0.33), which refuses expert
    parallelism for a model without experts. Restated: the harness's model is a stand-in whose
    ``is_moe`` is the case's fact. (Its other checks read head counts and the model class's
    SupportsPP, which specs do not carry; python -m referee serve-check runs the real one.)"""
    if cfg.parallel_config.enable_expert_parallel and not facts.get("is_moe"):
        raise ValueError(NO_EXPERTS)


_CLASS_PROBE = """
import json, logging
from referee.serve_real import prepare
prepare()
logging.getLogger("vllm").setLevel(logging.CRITICAL)
from referee.architectures import ARCHITECTURE_POOL
from vllm.model_executor.models.interfaces import supports_lora, supports_pp
from vllm.model_executor.models.interfaces_base import is_pooling_model, is_text_generation_model
from vllm.model_executor.models.registry import ModelRegistry
without_pp, pooling_only, without_lora = [], [], []
for arch in ARCHITECTURE_POOL:
    registered = ModelRegistry.models.get(arch)
    if registered is None:
        continue
    try:
        model_cls = registered.load_model_cls()
    except Exception:  # an optional package of that model is missing here
        continue
    if not supports_pp(model_cls):
        without_pp.append(arch)
    if not supports_lora(model_cls):
        without_lora.append(arch)
    if is_pooling_model(model_cls) and not is_text_generation_model(model_cls):
        pooling_only.append(arch)
registered = list(ModelRegistry.get_supported_archs())
print(json.dumps({"without_pp": without_pp, "pooling_only": pooling_only,
                  "without_lora": without_lora, "registered": registered}))
"""


@cache
def _class_facts() -> dict[str, Any]:
    """What the installed release's model classes say of the pool's architectures, asked in a
    child process with the real-code referee's stand-ins (this harness stubs the CUDA-graph
    module the model classes import). A class this environment cannot import (torchvision and
    others are not installed) is left out, as the packs leave it."""
    proc = subprocess.run(
        [sys.executable, "-c", _CLASS_PROBE], capture_output=True, text=True, check=True
    )
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        key: tuple(value) if key == "registered" else frozenset(value)
        for key, value in facts.items()
    }


def classes_without_pp() -> frozenset[str]:
    """The architectures whose model class does not implement ``SupportsPP`` (its own
    ``supports_pp``)."""
    return _class_facts()["without_pp"]


def pooling_only_classes() -> frozenset[str]:
    """The architectures whose model class is a pooling model and not a text-generation one
    (``is_pooling_model`` and not ``is_text_generation_model``, interfaces_base.py)."""
    return _class_facts()["pooling_only"]


def classes_without_lora() -> frozenset[str]:
    """The architectures whose model class does not implement ``SupportsLoRA`` (its own
    ``supports_lora``, what ``ModelConfig.is_lora_supported`` reads)."""
    return _class_facts()["without_lora"]  # type: ignore[no-any-return]


def lora_needs_supports_lora(spec: dict[str, Any], release: str) -> None:
    """``LoRAConfig.verify_with_model_config`` (config/lora.py:147 of 0.33, new in 0.33; called
    by ``VllmConfig.__post_init__`` after the NIXL asserts): LoRA needs a model class that
    implements ``SupportsLoRA``. Restated: the raise; the spec's ``model`` stands for the
    model's path (None when the spec names none)."""
    if (
        _v(release) >= (0, 33)
        and spec.get("lora")
        and spec["architecture"] in classes_without_lora()
    ):
        raise ValueError(
            f"LoRA is not supported for {spec['architecture']} ({spec.get('model')}). "
            "Supported models implement the `SupportsLoRA` interface. Run this model without "
            "`enable_lora`."
        )


def registered_architectures() -> tuple[str, ...]:
    """Every architecture the release's ``ModelRegistry`` knows, in its own order
    (``get_supported_archs()``, the order its refusal text lists them in)."""
    return _class_facts()["registered"]  # type: ignore[no-any-return]


def pipeline_needs_supports_pp(cfg: Any, spec: dict[str, Any]) -> None:
    """``ModelConfig.verify_with_parallel_config`` (config/model.py:1425 of 0.29, the same text
    through 0.33), after the expert check: pipeline parallelism needs a model class that
    implements ``SupportsPP`` (:func:`classes_without_pp`). Restated: the raise."""
    if cfg.parallel_config.pipeline_parallel_size > 1 and (
        spec["architecture"] in classes_without_pp()
    ):
        raise NotImplementedError(
            "Pipeline parallelism is not supported for this model. "
            "Supported models implement the `SupportsPP` interface."
        )


def nixl_layout(cfg: Any, facts: dict[str, Any], release: str) -> None:
    """``VllmConfig.__post_init__``'s NIXL asserts (config/vllm.py:1146-1168 of 0.29,
    1327-1345 of 0.30, the 0.30 text through 0.33): a NIXL side is fully replicated or fully
    DCP-sharded, MLA only; 0.29 also refuses PCP and hybrid models, 0.30 compares with
    ``max(tp, pcp)``. Restated: the asserts; ``has_connector`` is the release's own."""
    kv = cfg.kv_transfer_config
    if kv is None or not kv.has_connector("NixlConnector"):
        return
    pc = cfg.parallel_config
    dcp, tp, pcp = (
        pc.decode_context_parallel_size,
        pc.tensor_parallel_size,
        pc.prefill_context_parallel_size,
    )
    if _v(release) < (0, 30):
        assert pcp == 1, "NIXL does not support prefill context parallelism."
        assert dcp in (1, tp), (
            f"decode_context_parallel_size={dcp} must be 1 or equal "
            f"to tensor_parallel_size={tp} when using NixlConnector."
        )
    else:
        transfer_tp_size = max(tp, pcp)
        assert dcp in (1, transfer_tp_size), (
            f"decode_context_parallel_size={dcp} must be 1 or equal "
            f"to the NIXL transfer parallel size={transfer_tp_size}."
        )
    assert facts.get("use_mla") or dcp == 1, (
        "PD with decode_context_parallel_size > 1 is only supported for MLA models."
    )
    if _v(release) < (0, 30):
        assert not (facts.get("is_hybrid") and dcp > 1), (
            "PD with decode_context_parallel_size > 1 is not supported for hybrid Mamba/SSM models."
        )


def replay(
    cfg: Any, spec: dict[str, Any], facts: dict[str, Any], release: str, capture: Any
) -> str:
    """Run ``release``'s steps in order; the runner ("v1"/"v2"), or the ValueError or
    AssertionError vLLM raises on the way."""
    from referee import late

    v = _v(release)
    model_hooks(cfg, spec, release)
    if v in ((0, 30), (0, 31)):
        cfg._check_watermarking_unsupported()
    elif v >= (0, 32):  # renamed, same place (vllm.py:1446 of 0.32, 1543 of 0.33)
        cfg._check_supports_watermarking()
    expert_parallel_needs_experts(cfg, facts)
    pipeline_needs_supports_pp(cfg, spec)
    if v >= (0, 33) and spec.get("speculative_method") not in (None, "none", "suffix"):
        # _limit_max_model_len_to_draft (vllm.py:1554 of 0.33) asks the selection for any
        # speculative config with a draft model config: every method but suffix (the
        # n-gram-style ones use the target's). Its log lines, or the variable's error, stay.
        _evaluate(cfg, capture, spec)
    nixl_layout(cfg, facts, release)
    lora_needs_supports_lora(spec, release)
    cfg.parallel_config.set_dcp_defaults()
    async_scheduling(cfg, spec, release, capture)
    enforce_eager(cfg, spec, release)
    if v == (0, 31):
        batch_invariant(cfg, spec, release)
    breakable = compile_defaults(cfg, spec, release)
    late.hisparse(cfg, spec, release)
    piecewise(cfg, spec, release, breakable)
    late.sequence_parallelism(cfg, spec, release)
    late.static_graphs(cfg, spec, release)
    late.kv_sharing(cfg, spec, release)
    late.platform_hook(cfg, spec, release)
    if v >= (0, 30):
        piecewise(cfg, spec, release, breakable)
    return late.final(cfg, spec, release, lambda: _selecting(capture, spec))
