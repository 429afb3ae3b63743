"""The engine's configuration: one frozen value built by the ``LLM`` facade (from its arguments
and the model) and handed to the scheduler and to the runner. Names follow vLLM's engine
arguments."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

from turnout.engine.errors import EngineConfigError
from turnout.engine.pooling_params import POOLING_TASKS

#: Speculative methods SpeculativeConfig can express (the oracle knows more; those are refused
#: here, before any runner is built). Which runner implements which: the runners' manifests
#: (runner_v1: ``ngram`` on the CPU; runner_v2: ``ngram_gpu`` and ``draft_model`` on the device).
SUPPORTED_SPECULATIVE_METHODS = ("ngram", "ngram_gpu", "draft_model")
#: The methods that match n-grams of a request's own tokens (prompt lookup decoding).
NGRAM_METHODS = ("ngram", "ngram_gpu")
#: Device types an EngineConfig accepts (``cuda:N`` names one GPU): the platforms a runner can
#: be started on.
DEVICE_TYPES = ("cpu", "cuda")
#: vLLM's ``--mamba-cache-mode`` values and what turnout's runners do with each: ``none`` is
#: honoured (one state per request, no prefix caching of Mamba layers); ``align`` and ``all``
#: (states cached at block boundaries so prefixes can be reused) are refused by name.
MAMBA_CACHE_MODES = {"none": "honoured", "align": "refused", "all": "refused"}
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding, in vLLM's ``--speculative-config`` terms.

    Attributes:
        method: ``"ngram"`` (prompt lookup decoding on the CPU history, Saxena 2023),
            ``"ngram_gpu"`` (the same over the device token table) or ``"draft_model"`` (a
            smaller model of the same vocabulary proposes; Leviathan et al. 2023); other
            methods are refused with :class:`EngineConfigError`. Without ``method``,
            :meth:`from_dict` infers ``draft_model`` from ``model`` (as vLLM does), else
            ``ngram``.
        model: the draft model (HF directory or ``.gguf``), for ``draft_model`` only.
        num_speculative_tokens: drafts proposed per step (``>= 1``).
        prompt_lookup_min: shortest suffix n-gram matched (``>= 1``; n-gram methods).
        prompt_lookup_max: longest suffix n-gram matched (``>= prompt_lookup_min``).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in SUPPORTED_SPECULATIVE_METHODS:
            raise EngineConfigError(
                f"speculative method {self.method!r} is not implemented by turnout's runners "
                f"(supported: {', '.join(SUPPORTED_SPECULATIVE_METHODS)})"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise EngineConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise EngineConfigError(
                f"need 1 <= prompt_lookup_min ({self.prompt_lookup_min}) <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        if self.method == "draft_model" and (not isinstance(self.model, str) or not self.model):
            raise EngineConfigError(
                f"speculative method 'draft_model' needs the draft model: speculative_config['model'] "
                f"(an HF directory or .gguf file), got {self.model!r}"
            )
        if self.method != "draft_model" and self.model is not None:
            raise EngineConfigError(
                f"speculative_config['model'] names a draft model, which method {self.method!r} does not "
                f"use (use method 'draft_model')"
            )

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> SpeculativeConfig:
        """From vLLM's ``--speculative-config`` JSON keys; unknown keys are an error."""
        if not isinstance(spec, dict):
            raise EngineConfigError(
                f"speculative_config must be a JSON object of vLLM's keys, got a {type(spec).__name__}"
            )
        known = {
            "method",
            "model",
            "num_speculative_tokens",
            "prompt_lookup_min",
            "prompt_lookup_max",
        }
        unknown = sorted(set(spec) - known)
        if unknown:
            raise EngineConfigError(
                f"unknown speculative_config keys {unknown} (known: {sorted(known)})"
            )
        spec = dict(spec)
        if "method" not in spec and spec.get("model") is not None:
            spec["method"] = "draft_model"  # vLLM: a draft model without a method
        return cls(**spec)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the scheduler and a runner need to know about the deployment.

    Attributes:
        model: HF safetensors directory or ``.gguf`` file.
        vocab_size: the model's vocabulary (token ids are checked against it).
        max_model_len: tokens per request at most (prompt + output).
        eos_token_ids: ids that finish a request unless ``ignore_eos``.
        runner_kind: ``"generate"`` (decoder) or ``"pooling"`` (embeddings, classifiers).
        pooling_tasks: the pooling tasks the model serves (``engine.pooling_params``:
            embed, classify, score, reward); at least one when pooling, none when generating.
        dtype: weights and activations, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:N"``).
        seed: seeds the generator that gives unseeded requests their seed.
        max_num_seqs: requests in a step at most.
        max_num_batched_tokens: tokens in a step at most (the token budget).
        block_size: tokens per KV block.
        enable_chunked_prefill: split prompts over steps to fit the token budget.
        enable_prefix_caching: reuse KV blocks of identical prefixes.
        max_logprobs: the most ``logprobs`` / ``prompt_logprobs`` a request may ask for.
        num_kv_blocks: KV blocks to allocate; ``None``: from ``kv_cache_memory_gb``.
        kv_cache_memory_gb: memory for the KV cache when ``num_kv_blocks`` is ``None``.
        cpu_offload_gb: GiB of weights kept in host memory and streamed in per forward.
        speculative_config: speculative decoding (n-gram or a draft model), or ``None``.
        enforce_eager: never capture CUDA graphs (vLLM's ``--enforce-eager``); otherwise
            both runners replay graphs for decode batches on CUDA.
        load_format: ``"auto"`` (read the weights) or ``"dummy"`` (vLLM's ``--load-format
            dummy``: only ``config.json`` is read; seeded random weights, drawn with ``seed`` on
            ``device``; see ``engine.model.loader.load_model``).
        mamba_cache_mode: vLLM's ``--mamba-cache-mode``; only ``"none"`` is implemented (each
            request's Mamba state lives in one slot; prefixes of such models are not cached).
        tensor_parallel_size: ranks the model is split over (vLLM's ``-tp``), one process each
            (``docs/tensor-parallel.md``): this process is rank 0; on CUDA rank ``r`` runs on
            ``cuda:r``. Llama-family decoders only (checked against the model by
            ``engine.model_info.engine_config_for``).
    """

    model: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    runner_kind: str = "generate"
    pooling_tasks: tuple[str, ...] = ()
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    max_logprobs: int = 20
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float | None = None
    cpu_offload_gb: float = 0.0
    speculative_config: SpeculativeConfig | None = None
    enforce_eager: bool = False
    load_format: str = "auto"
    mamba_cache_mode: str = "none"
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        self._check_types()
        if self.load_format not in ("auto", "dummy"):
            raise EngineConfigError(
                f"load_format must be 'auto' or 'dummy', got {self.load_format!r}"
            )
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise EngineConfigError(
                f"mamba_cache_mode must be one of {', '.join(MAMBA_CACHE_MODES)}, got {self.mamba_cache_mode!r}"
            )
        if MAMBA_CACHE_MODES[self.mamba_cache_mode] == "refused":
            raise EngineConfigError(
                f"mamba_cache_mode={self.mamba_cache_mode!r} (Mamba states cached at block boundaries "
                f"for prefix caching) is not implemented by turnout's runners: use 'none'"
            )
        if self.runner_kind not in ("generate", "pooling"):
            raise EngineConfigError(
                f"runner_kind must be 'generate' or 'pooling', got {self.runner_kind!r}"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise EngineConfigError(
                f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}"
            )
        if not isinstance(self.device, str) or not _DEVICE.fullmatch(self.device):
            raise EngineConfigError(
                f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise EngineConfigError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len}): a long prompt could never run"
            )
        self._check_pooling_tasks()
        if self.speculative_config is not None and self.runner_kind == "pooling":
            raise EngineConfigError("speculative decoding does not apply to pooling models")
        self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        tp = self.tensor_parallel_size
        if not _is_int(tp) or tp < 1:
            raise EngineConfigError(f"tensor_parallel_size must be an int >= 1, got {tp!r}")
        if tp == 1:
            return
        flag = f"tensor_parallel_size={tp}"
        if self.runner_kind == "pooling":
            raise EngineConfigError(
                f"{flag}: tensor parallelism is not implemented for pooling models"
            )
        if self.cpu_offload_gb > 0:
            raise EngineConfigError(
                f"{flag} with cpu_offload_gb={self.cpu_offload_gb}: offloading a "
                "tensor-parallel shard is not implemented"
            )
        spec = self.speculative_config
        if spec is not None and spec.method == "draft_model":
            raise EngineConfigError(
                f"{flag} with speculative method 'draft_model': the draft model is "
                "not sharded; use ngram / ngram_gpu, or tensor_parallel_size=1"
            )
        if self.device.startswith("cuda:") and self.device != "cuda:0":
            raise EngineConfigError(
                f"{flag} on device {self.device!r}: rank r runs on cuda:r; pass "
                "device 'cuda' (restrict the GPUs with CUDA_VISIBLE_DEVICES)"
            )

    def _check_pooling_tasks(self) -> None:
        tasks = self.pooling_tasks
        if not isinstance(tasks, tuple) or not set(tasks) <= set(POOLING_TASKS):
            raise EngineConfigError(
                f"pooling_tasks must be a tuple of {', '.join(POOLING_TASKS)}, got {tasks!r}"
            )
        if (self.runner_kind == "pooling") != bool(tasks):
            raise EngineConfigError(
                f"runner_kind {self.runner_kind!r} with pooling_tasks {tasks!r}: a pooling "
                "model serves at least one pooling task, a generating model none"
            )

    def _check_types(self) -> None:
        # Every number is checked for its type and range: nan compares false with anything (a
        # nan cpu_offload_gb would be silently no offload) and inf overflows int().
        positive = (
            "vocab_size",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
        )
        for name in positive:
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise EngineConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not _is_int(self.max_logprobs) or self.max_logprobs < 0:
            raise EngineConfigError(f"max_logprobs must be an int >= 0, got {self.max_logprobs!r}")
        if not _is_int(self.seed):
            raise EngineConfigError(f"seed must be an int, got {self.seed!r}")
        if self.num_kv_blocks is not None and (
            not _is_int(self.num_kv_blocks) or self.num_kv_blocks < 1
        ):
            raise EngineConfigError(
                f"num_kv_blocks must be an int >= 1, got {self.num_kv_blocks!r}"
            )
        if not _is_finite(self.cpu_offload_gb) or self.cpu_offload_gb < 0:
            raise EngineConfigError(
                f"cpu_offload_gb must be a finite number >= 0, got {self.cpu_offload_gb!r}"
            )
        memory = self.kv_cache_memory_gb
        if memory is not None and (not _is_finite(memory) or memory <= 0):
            raise EngineConfigError(
                f"kv_cache_memory_gb must be a finite number > 0, got {memory!r}"
            )
        if not all(_is_int(t) and 0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise EngineConfigError(
                f"eos_token_ids must be token ids in [0, vocab_size={self.vocab_size}), got {self.eos_token_ids!r}"
            )
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise EngineConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def check_field_names(cls, names: set[str]) -> None:
        """Raise :class:`EngineConfigError` naming any of ``names`` that is not a field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(names - known)
        if unknown:
            raise EngineConfigError(
                f"unknown engine arguments {unknown}; known: {', '.join(sorted(known))}"
            )

    @property
    def max_num_blocks_per_req(self) -> int:
        """Block-table width: blocks for ``max_model_len`` tokens."""
        return -(-self.max_model_len // self.block_size)

    @property
    def num_speculative_tokens(self) -> int:
        return (
            0 if self.speculative_config is None else self.speculative_config.num_speculative_tokens
        )


__all__ = [
    "DEVICE_TYPES",
    "MAMBA_CACHE_MODES",
    "NGRAM_METHODS",
    "SUPPORTED_SPECULATIVE_METHODS",
    "EngineConfig",
    "SpeculativeConfig",
]
