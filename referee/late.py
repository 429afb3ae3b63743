"""The later half of the replayed ``__post_init__``: HiSparse, sequence parallelism, CUDA-graph
support, the platform hook, the final selection and the checks right after it.

See :mod:`referee.replay` for what is replayed and why; line numbers cite 0.31.0's
``vllm/config/vllm.py``.
"""

from __future__ import annotations

from typing import Any


def _v(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def hisparse(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """vllm.py:1813 (0.30+): a HiSparseConnector turns HiSparse on; HiSparse's refusals."""
    if _v(release) < (0, 30):
        return
    from vllm.config.attention import HiSparseConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.platforms import current_platform

    att, kv = cfg.attention_config, cfg.kv_transfer_config
    if att.hisparse_config is None and kv is not None and kv.has_connector("HiSparseConnector"):
        att.hisparse_config = HiSparseConfig()
    if att.hisparse_config is None:
        return
    pc = cfg.parallel_config
    if not current_platform.is_cuda():
        raise ValueError("HiSparse currently requires NVIDIA CUDA.")
    if pc.pipeline_parallel_size > 1:
        raise ValueError("HiSparse does not support pipeline parallelism.")
    if pc.decode_context_parallel_size > 1:
        raise ValueError("HiSparse does not support decode context parallelism.")
    if _v(release) >= (0, 32) and cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL:
        raise ValueError(
            "HiSparse does not support cudagraph_mode=FULL; use "
            "FULL_AND_PIECEWISE (the default), which captures FULL graphs "
            "for decode batches."
        )
    if not hasattr(cfg.model_config.hf_config, "index_topk"):
        raise ValueError("HiSparse is only supported for DSA models with index_topk.")


def sequence_parallelism(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """vllm.py:1863 (0.29-0.31): SP needs TP > 1, and vLLM's threshold heuristic turns it off
    for models too small for the device (get_sequence_parallelism_threshold)."""
    if _v(release) >= (0, 32):
        return
    pc = cfg.compilation_config.pass_config
    if pc.fuse_gemm_comms:
        pc.enable_sp = True
    if not pc.enable_sp:
        return
    tp = cfg.parallel_config.tensor_parallel_size
    if tp == 1:
        pc.enable_sp = pc.fuse_gemm_comms = False
        return
    if pc.sp_min_token_num is None:
        mc = cfg.model_config
        pc.sp_min_token_num = _sp_threshold()(mc.get_hidden_size(), tp, mc.dtype.itemsize)
    if pc.sp_min_token_num is None:
        pc.enable_sp = pc.fuse_gemm_comms = False


def _sp_threshold() -> Any:
    """The release's get_sequence_parallelism_threshold with its tables, run from source (its
    module imports CUDA ops at import time)."""
    from referee.extract import release_definitions

    return release_definitions(
        "vllm.compilation.passes.fusion.sequence_parallelism",
        ("SP_MIN_HIDDEN_SIZE", "SP_MIN_PER_GPU_SIZE_MB", "get_sequence_parallelism_threshold"),
    )["get_sequence_parallelism_threshold"]


def static_graphs(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """vllm.py:1913-1979: pooling models lose FULL graphs, encoder-decoders keep
    FULL_DECODE_ONLY, layerwise KV connectors force PIECEWISE, enforce_eager and platforms
    without static graphs get NONE."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.platforms import current_platform

    cc, mc, kv = cfg.compilation_config, cfg.model_config, cfg.kv_transfer_config
    if not current_platform.support_static_graph_mode():
        cc.cudagraph_mode = CUDAGraphMode.NONE
        return
    if cc.cudagraph_mode.has_full_cudagraphs() and mc.pooler_config is not None:
        cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    elif mc.is_encoder_decoder and cc.cudagraph_mode not in (
        CUDAGraphMode.NONE,
        CUDAGraphMode.FULL_DECODE_ONLY,
    ):
        cc.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    if kv is not None and kv.is_kv_transfer_instance and cc.cudagraph_mode.has_full_cudagraphs():
        _registered_connector(kv)
        if _layerwise_connector(kv.kv_connector, kv.kv_connector_extra_config):
            cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    if mc.enforce_eager:
        cc.cudagraph_mode = CUDAGraphMode.NONE


def _registered_connector(kv: Any) -> None:
    """``KVConnectorFactory.get_connector_class`` (kv_connector/factory.py), which the
    layerwise check above and :func:`hybrid_kv_cache_connector` ask: a connector without a module path must be in the
    release's own registry (read here; its classes are not loaded, their modules import CUDA
    kernels). Restated: the raise."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if kv.kv_connector_module_path:
        return
    if kv.kv_connector not in KVConnectorFactory._registry:
        raise ValueError(f"Unsupported connector type: {kv.kv_connector}")


def _layerwise_connector(name: str | None, extra: dict[str, Any]) -> bool:
    """``requires_piecewise_for_cudagraph`` of the connector classes (their modules import CUDA
    kernels): only LMCacheConnectorV1 with ``use_layerwise`` says yes
    (kv_connector/v1/lmcache_connector.py), and MultiConnector when one of its children does
    (multi_connector.py); the base class says no."""
    if name == "LMCacheConnectorV1":
        return bool(extra.get("use_layerwise", False))
    if name == "MultiConnector":
        return any(
            _layerwise_connector(c.get("kv_connector"), c.get("kv_connector_extra_config", {}))
            for c in extra.get("connectors", [])
        )
    return False


def kv_sharing(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """vllm.py:1981: KV-sharing fast prefill refuses EAGLE-style drafting."""
    sc = cfg.speculative_config
    if cfg.cache_config.kv_sharing_fast_prefill and sc is not None and sc.use_eagle():
        raise ValueError(
            "Fast prefill optimization for KV sharing is not compatible with "
            "EAGLE as EAGLE requires correct logits for all tokens while fast "
            "prefill gives incorrect logits for prompt tokens."
        )


def platform_hook(cfg: Any, spec: dict[str, Any], release: str) -> None:
    """``current_platform.check_and_update_config`` (vllm.py:2026), the parts that touch
    what the selection reads: CPU (platforms/cpu.py) turns async scheduling and DBO off and
    VLLM_COMPILE into DYNAMO_TRACE_ONCE (NONE with LoRA); ROCm (platforms/rocm.py) drops FULL
    graphs under prefill context parallelism (and in 0.30 refuses it with data parallelism).
    CUDA's refuses prefill context parallelism with data parallelism in 0.30
    (platforms/cuda.py:338, its first statement) and changes nothing else the selection reads;
    XPU changes none of them (XPU graphs assumed supported by its PyTorch); TPU's hook lives in
    tpu-inference."""
    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    platform = spec.get("platform", "cuda")
    cc, pc = cfg.compilation_config, cfg.parallel_config
    if platform == "cpu":
        cfg.scheduler_config.async_scheduling = False
        if pc.distributed_executor_backend == "uni":
            pc.distributed_executor_backend = "mp"
        pc.enable_dbo = False
        if cc.mode == CompilationMode.VLLM_COMPILE:
            cc.mode = CompilationMode.DYNAMO_TRACE_ONCE
        if cfg.lora_config is not None:
            cc.mode = CompilationMode.NONE
    elif platform == "cuda":
        if (
            _v(release) == (0, 30)
            and pc.prefill_context_parallel_size > 1
            and pc.data_parallel_size > 1
        ):
            raise ValueError("PCP does not support data parallelism on CUDA yet.")
    elif platform == "rocm":
        if (
            _v(release) == (0, 30)
            and pc.prefill_context_parallel_size > 1
            and pc.data_parallel_size > 1
        ):
            raise ValueError("PCP does not support data parallelism on ROCm yet.")
        if cc.cudagraph_mode.has_full_cudagraphs() and pc.prefill_context_parallel_size > 1:
            cc.cudagraph_mode = CUDAGraphMode.PIECEWISE


def final(cfg: Any, spec: dict[str, Any], release: str, evaluate: Any) -> str:
    """vllm.py:2051: the selection that counts, then the chosen runner's validation (0.32+
    first turn CUDA graphs off for stock torch.compile on V2; that step's own log line is not
    the selection's and is not captured)."""
    with evaluate():
        v2 = bool(cfg.use_v2_model_runner)
    if v2 and _v(release) >= (0, 32):
        cfg._disable_cudagraphs_for_v2_stock_torch_compile()
    with evaluate():
        if v2:
            cfg._validate_v2_model_runner()
        else:
            cfg._validate_v1_model_runner()
    cfg._validate_batch_sharded_sampling()  # vllm.py:1658 of 0.29, the release's own method
    final_graph_check(cfg)
    microbatching_backends(cfg, release)
    hybrid_kv_cache_connector(cfg)
    return "v2" if v2 else "v1"


def final_graph_check(cfg: Any) -> None:
    """The final check of the CUDA graph mode (vllm.py:1714 of 0.29, 2166 of 0.33, the same
    text): piecewise graphs need VLLM_COMPILE unless breakable graphs are on. Only a pooling
    model's PIECEWISE, set after 0.29's one normalisation, still meets it. Restated: the
    assertion sits in the middle of ``__post_init__``."""
    from vllm import envs
    from vllm.config.compilation import CompilationMode
    from vllm.platforms import current_platform

    cc = cfg.compilation_config
    if current_platform.is_cuda_alike() and cc.cudagraph_mode.requires_piecewise_compilation():
        assert cc.mode == CompilationMode.VLLM_COMPILE or envs.VLLM_USE_BREAKABLE_CUDAGRAPH, (
            "Compilation mode should be CompilationMode.VLLM_COMPILE "
            "when cudagraph_mode piecewise cudagraphs is used, "
            f"cudagraph_mode={cc.cudagraph_mode}"
        )


def hybrid_kv_cache_connector(cfg: Any) -> None:
    """vllm.py:1819 of 0.29 (2264 of 0.33), after the microbatching check: with the hybrid KV
    cache manager left unset, ``KVConnectorFactory.supports_hma_config`` looks the connector
    class up, whatever the CUDA graph mode (:func:`_registered_connector`)."""
    kv = cfg.kv_transfer_config
    if kv is not None and cfg.scheduler_config.disable_hybrid_kv_cache_manager is None:
        _registered_connector(kv)


def microbatching_backends(cfg: Any, release: str) -> None:
    """The all2all backends dual batch overlap runs with, after the selection (inline in
    ``__post_init__``: vllm.py:1733 of 0.29, 2180 of 0.33, where ROCm also takes
    allgather_reducescatter). Restated: the assertion sits in the middle of the method."""
    from vllm.platforms import current_platform

    pc = cfg.parallel_config
    if not pc.use_ubatching:
        return
    supported = ["deepep_low_latency", "deepep_high_throughput", "nixl_ep"]
    if _v(release) < (0, 33):
        assert pc.all2all_backend in supported, (
            "Microbatching currently only supports the deepep_low_latency, "
            "deepep_high_throughput, and nixl_ep all2all backends. "
            f"{pc.all2all_backend} is not supported. To fix use "
            "--all2all-backend=deepep_low_latency, "
            "--all2all-backend=deepep_high_throughput, or "
            "--all2all-backend=nixl_ep and install the matching kernels."
        )
        return
    if current_platform.is_rocm():
        supported.append("allgather_reducescatter")
    assert pc.all2all_backend in supported, (
        "Microbatching currently only supports the "
        f"{', '.join(supported)} all2all backends on this "
        f"platform. {pc.all2all_backend} is not supported. To fix use one of "
        f"{', '.join('--all2all-backend=' + b for b in supported)}"
        " and install the matching kernels."
    )
