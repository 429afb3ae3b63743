"""What both runners do the same way, written once: load the model and check it against the
engine's config, size and allocate the KV cache (``runner_loader`` calls these through the
:class:`~engine.runner_protocol.ModelRunner` protocol), refuse generation options for a
pooling model, and the pooling path (one forward over the step's new requests,
``engine/runner_pooling.py``).

:class:`RunnerBase` holds that part of a runner; ``runner_v1.V1ModelRunner`` and
``runner_v2.V2ModelRunner`` derive from it and add their step. Imported by the runner packages
only (it loads torch and the model layer).
"""

from __future__ import annotations

import logging

import torch

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineConfigError, UnsupportedOptionError
from turnout.engine.model import (
    DecoderModel,
    EncoderModel,
    LlamaForSequenceClassification,
    allocate_kv_caches,
    load_model,
)
from turnout.engine.model.parallel_layers import TENSOR_PARALLEL_ARCHITECTURES, TensorParallel
from turnout.engine.model.state_cache import HybridCacheSpec, MambaState
from turnout.engine.pooling_params import POOLING_TASKS, PoolingParams
from turnout.engine.runner_pooling import PoolingKVScratch, pool_decoder, pool_encoder
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput

# vLLM pooling tasks the shared pooling path serves (which model serves which: its
# architecture, engine/model/pooling_config.py): ``embed`` (mean-pooled, L2-normalised
# embeddings, sentence-transformers' all-MiniLM-L6-v2 recipe), ``classify`` and ``score``
# (sequence-classification logits, of single texts or of pairs with token types) and ``reward``
# (a decoder's head at the last token). POOLING_TASKS is re-exported for the manifests, and
# TENSOR_PARALLEL_ARCHITECTURES (the architectures the model layer shards) too.

logger = logging.getLogger("turnout.engine")


def load_engine_model(
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    tensor_parallel: TensorParallel | None = None,
) -> DecoderModel | EncoderModel:
    """``config.model`` loaded in ``dtype`` on ``device`` (``tensor_parallel``: this rank's
    shard); logs its quantization report (``engine.model.quantization``) on the
    ``turnout.engine`` logger.

    Raises:
        EngineConfigError: the model's ``vocab_size`` is not ``config.vocab_size``, or
            speculative decoding for a model with Mamba layers.
        ModelConfigError, WeightLoadError: from :func:`engine.model.load_model`.
    """
    model = load_model(
        config.model,
        dtype=dtype,
        device=device,
        seed=config.seed,
        load_format=config.load_format,
        tensor_parallel=tensor_parallel,
    )
    if model.config.has_inner_state and config.speculative_config is not None:
        # Scoring drafts runs them through the Mamba layers: a rejected draft would stay in the
        # request's one recurrent state (no per-token snapshot to roll back to).
        raise EngineConfigError(
            f"speculative decoding ({config.speculative_config.method!r}) is not supported for "
            f"{model.config.architecture}: its Mamba layers keep one recurrent state per request, "
            f"which rejected draft tokens would corrupt; drop speculative_config"
        )
    # What the weights are and how they run (FP8 W8A8 or dequantised, GGUF dequantised).
    logger.info("%s", model.quantization_report)
    if model.config.vocab_size != config.vocab_size:
        raise EngineConfigError(
            f"the engine expects vocab_size {config.vocab_size}, the model has {model.config.vocab_size}"
        )
    return model


def kv_block_bytes(
    model: DecoderModel | EncoderModel | None, block_size: int, dtype: torch.dtype
) -> int:
    """Bytes one KV block of ``block_size`` slots takes over all layers, as the model's
    ``kv_cache_spec`` lays it out (keys and values per kv head, or MLA's latent rows); 0 for a
    pooling model: an encoder keeps no KV cache, a pooling decoder only a step-local one
    (:class:`~engine.runner_pooling.PoolingKVScratch`), not the engine's block pool."""
    assert model is not None, "load_model() first"
    if model.config.is_pooling or isinstance(model, EncoderModel):  # every encoder pools
        return 0
    return int(model.kv_cache_spec.bytes_per_block(block_size, dtype))


def state_cache_bytes(
    model: DecoderModel | EncoderModel | None, num_slots: int, dtype: torch.dtype
) -> int:
    """Bytes the per-request recurrent state of ``num_slots`` requests takes over every Mamba
    layer (``engine.model.state_cache``); 0 for models without such state."""
    assert model is not None, "load_model() first"
    if isinstance(model, EncoderModel) or not isinstance(model.kv_cache_spec, HybridCacheSpec):
        return 0
    return num_slots * model.kv_cache_spec.state_bytes_per_slot(dtype)


def kv_cache_budget(device: torch.device, gpu_fraction: float, cpu_bytes: int) -> int:
    """Bytes the KV cache may take: ``gpu_fraction`` of the GPU memory free now (after the model
    is loaded), or ``cpu_bytes`` on the CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * gpu_fraction)
    return cpu_bytes


class RunnerBase:
    """The set-up half of :class:`~engine.runner_protocol.ModelRunner`, shared by both runners.

    Subclasses set the KV budget (``gpu_kv_fraction`` of the free GPU memory, ``cpu_kv_bytes``
    on CPU) and add ``execute_model``; they extend ``load_model`` (features applied to the loaded
    model), ``initialize_kv_cache`` (buffers that need the cache) and ``check_sampling_params``.

    Attributes:
        model: the loaded model (``None`` before ``load_model``).
        kv_caches: per layer ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (empty for
            a pooling model); a :class:`~engine.model.state_cache.MambaState` of ``max_num_seqs``
            slots for each Mamba layer.
        pooling_scratch: a pooling decoder's step-local paged cache (``None`` otherwise).
        tensor_parallel: this process's rank when ``tensor_parallel_size > 1`` (the model is
            its shard, on ``cuda:rank`` on CUDA; ``engine.parallel``), else ``None``.
    """

    gpu_kv_fraction = 0.9
    cpu_kv_bytes = 1 << 30

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.tensor_parallel: TensorParallel | None = None
        if config.tensor_parallel_size > 1:
            from turnout.engine.parallel.group import current_tensor_parallel, rank_device

            self.tensor_parallel = current_tensor_parallel(config.tensor_parallel_size)
            assert self.tensor_parallel is not None
            self.device = torch.device(rank_device(config.device, self.tensor_parallel.rank))
        self.dtype: torch.dtype = getattr(torch, config.dtype)
        self.model: DecoderModel | EncoderModel | None = None
        self.kv_caches: list[torch.Tensor | MambaState] = []
        self.pooling_scratch: PoolingKVScratch | None = None

    def load_model(self) -> None:
        self.model = load_engine_model(self.config, self.dtype, self.device, self.tensor_parallel)

    @property
    def is_pooling(self) -> bool:
        """The model pools (embeddings, classifiers, reward models): no sampling, one step per
        request."""
        return self.model is not None and self.model.config.is_pooling

    def kv_cache_block_bytes(self) -> int:
        return kv_block_bytes(self.model, self.config.block_size, self.dtype)

    @property
    def has_inner_state(self) -> bool:
        """The model keeps per-request recurrent state (Mamba layers) beside its KV cache."""
        return self.model is not None and self.model.config.has_inner_state

    def state_cache_bytes(self) -> int:
        """Bytes of the state cache of ``max_num_seqs`` requests (taken from the KV budget)."""
        return state_cache_bytes(self.model, self.config.max_num_seqs, self.dtype)

    def available_kv_cache_bytes(self) -> int:
        return kv_cache_budget(
            self.device, gpu_fraction=self.gpu_kv_fraction, cpu_bytes=self.cpu_kv_bytes
        )

    def initialize_kv_cache(self, num_blocks: int) -> None:
        assert self.model is not None, "load_model() first"
        c = self.config
        if isinstance(self.model, LlamaForSequenceClassification):
            self.pooling_scratch = PoolingKVScratch(
                self.model,
                max_num_tokens=c.max_num_batched_tokens,
                max_num_seqs=c.max_num_seqs,
                block_size=c.block_size,
                dtype=self.dtype,
                device=self.device,
            )
        elif not self.is_pooling:
            assert isinstance(self.model, DecoderModel)
            spec, block_size = self.model.kv_cache_spec, c.block_size
            if isinstance(spec, HybridCacheSpec):  # one state slot per running request
                self.kv_caches = spec.allocate(
                    num_blocks, block_size, c.max_num_seqs, self.dtype, self.device
                )
                return
            self.kv_caches = list(
                allocate_kv_caches(spec, num_blocks, block_size, self.dtype, self.device)
            )

    def check_sampling_params(self, params: SamplingParams) -> None:
        """Raises UnsupportedOptionError for any generation request to a pooling model."""
        if self.is_pooling:
            tasks = ", ".join(self.config.pooling_tasks)
            raise UnsupportedOptionError(
                f"{self.config.model} is a pooling model ({tasks}): it does not generate"
            )

    def pool_scheduled(self, so: SchedulerOutput) -> tuple[list[str], torch.Tensor]:
        """The step's requests in batch order and their pooled outputs ``[num_reqs, D] float32``
        on the device: embeddings (``D = hidden_size``) or head logits (``D = num_labels``). A
        pooling request runs whole in its first step, so every scheduled request is a new one."""
        model = self.model
        new = {r.req_id: r for r in so.scheduled_new_reqs}
        req_ids = list(so.num_scheduled_tokens)
        prompts = [new[r].prompt_token_ids for r in req_ids]
        if isinstance(model, EncoderModel):
            types = [_token_types(new[r].pooling_params) for r in req_ids]
            return req_ids, pool_encoder(model, prompts, types, self.device)
        assert (
            isinstance(model, LlamaForSequenceClassification) and self.pooling_scratch is not None
        )
        return req_ids, pool_decoder(model, self.pooling_scratch, prompts, self.device)


def _token_types(params: PoolingParams | None) -> tuple[int, ...] | None:
    return None if params is None else params.token_type_ids


__all__ = [
    "POOLING_TASKS",
    "TENSOR_PARALLEL_ARCHITECTURES",
    "RunnerBase",
    "kv_block_bytes",
    "kv_cache_budget",
    "load_engine_model",
    "state_cache_bytes",
]
