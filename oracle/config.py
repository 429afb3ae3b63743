"""DeploymentConfig: the frozen, hashable value a decision is made about
(docs/architecture.md §3.1).

Build one from keyword arguments here; :mod:`oracle.sources` builds one from a spec mapping
(``from_spec``), a ``vllm serve`` command line with its environment (``from_command``) or an HF
``config.json`` (``from_hf_config``), and imports this module (never the reverse). Every value
is checked on construction; bad input raises :class:`~oracle.errors.ConfigError` naming the
field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from turnout.oracle.coerce import (
    KIND_CHECKS,
    FrozenMap,
    check_capability,
    check_quantization,
    check_speculative_method,
    suggest,
    thaw,
)
from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.fields import (
    ALL2ALL_BACKENDS,
    COMPILATION_MODES,
    CUDAGRAPH_MODES,
    DEVICE_CAPABILITIES,
    DRAFT_LM_HEAD_QUANTIZATIONS,
    EXECUTOR_BACKENDS,
    MAMBA_CACHE_MODES,
    PLATFORMS,
    RUNNER_KINDS,
    SPECULATIVE_METHODS,
    Check,
    FieldInfo,
    declare,
    field_infos,
)


@dataclass(frozen=True, eq=True, repr=False, slots=True)
class DeploymentConfig:
    """One deployment's dimensions, each declared once below: default, kind, meaning, group,
    vocabulary (:data:`FIELD_INFO` is derived from these declarations).

    ``None`` on a model attribute (``is_moe``, ``runner_kind``, ...) means "from the pack's
    families.yaml". The hash is computed once, so a config can key caches cheaply.
    """

    # identity and model
    deployment_id: str | None = declare(
        None,
        "str",
        "stable id of the deployment (sticky percentage canaries)",
        "identity",
        changeable=False,
    )
    model: str | None = declare(
        None,
        "str",
        "model id or path as given (shown, and quoted where a refusal of vLLM prints it)",
        "model",
        changeable=False,
    )
    architecture: str | None = declare(
        None, "str", "HF `architectures[0]`", "model", changeable=False
    )
    model_type: str | None = declare(
        None, "str", "HF `model_type` (informational)", "model", changeable=False
    )
    family: str | None = declare(
        None, "str", "family override (normally from families.yaml)", "model", changeable=False
    )
    quantization: str = declare(
        "none",
        "str",
        "quantization method: a vLLM `--quantization` name, `none` when unquantized",
        "model",
        check=check_quantization,
    )
    runner_kind: str | None = declare(None, "enum", "vLLM `--runner`", "model", RUNNER_KINDS)
    is_moe: bool | None = declare(None, "opt_bool", "mixture of experts", "model", changeable=False)
    use_mla: bool | None = declare(
        None, "opt_bool", "multi-head latent attention", "model", changeable=False
    )
    has_inner_state: bool | None = declare(
        None, "opt_bool", "recurrent state (Mamba, linear attention)", "model", changeable=False
    )
    is_hybrid: bool | None = declare(
        None, "opt_bool", "attention mixed with state-space layers", "model", changeable=False
    )
    attention_free: bool | None = declare(
        None, "opt_bool", "no attention layers at all", "model", changeable=False
    )
    is_multimodal: bool | None = declare(
        None, "opt_bool", "multimodal inputs", "model", changeable=False
    )
    is_encoder_decoder: bool | None = declare(
        None, "opt_bool", "encoder-decoder model", "model", changeable=False
    )
    is_diffusion: bool | None = declare(
        None, "opt_bool", "diffusion language model", "model", changeable=False
    )
    has_index_topk: bool | None = declare(
        None,
        "opt_bool",
        "a DeepSeek sparse-attention indexer (HF `index_topk`)",
        "model",
        changeable=False,
    )
    supports_mamba_prefix_caching: bool | None = declare(
        None,
        "opt_bool",
        "the model's Mamba layers support prefix caching (vLLM `SupportsMambaPrefixCaching`)",
        "model",
        changeable=False,
    )
    hidden_size: int | None = declare(
        None, "int", "HF `hidden_size` (None: unknown)", "model", changeable=False, minimum=1
    )
    num_attention_heads: int | None = declare(
        None,
        "int",
        "HF `num_attention_heads` of the text config (None: unknown; vLLM reads 0 when absent)",
        "model",
        changeable=False,
        minimum=0,
    )
    num_key_value_heads: int | None = declare(
        None,
        "int",
        "total KV heads: HF `num_key_value_heads` or its aliases, else num_attention_heads "
        "(vLLM 0.29 transformers_utils/model_arch_config_convertor.py get_total_num_kv_heads)",
        "model",
        changeable=False,
        minimum=0,
    )
    vocab_size: int | None = declare(
        None,
        "int",
        "HF `vocab_size` of the text config (None: unknown; vLLM ModelConfig.get_vocab_size)",
        "model",
        changeable=False,
        minimum=0,
    )
    # platform
    platform: str = declare("cuda", "enum", "accelerator platform", "platform", PLATFORMS)
    triton_available: bool = declare(True, "bool", "Triton importable on the host", "platform")
    device_capability: str | None = declare(
        None,
        "enum",
        "CUDA/ROCm compute capability `major.minor` (None: 9.0, an H100/H200)",
        "platform",
        DEVICE_CAPABILITIES,
        check=check_capability,
    )
    # speculation
    speculative_method: str = declare(
        "none",
        "enum",
        "speculative decoding method (model-specific `*_mtp` names resolve to `mtp`)",
        "speculation",
        SPECULATIVE_METHODS,
        check=check_speculative_method,
    )
    num_speculative_tokens: int = declare(
        0, "int", "draft tokens per step (0 without speculation)", "speculation"
    )
    parallel_drafting: bool = declare(False, "bool", "draft all tokens in one pass", "speculation")
    enable_adaptive_verification: bool = declare(
        False, "bool", "adaptive draft verification", "speculation"
    )
    disable_padded_drafter_batch: bool = declare(
        False, "bool", "no padded drafter batch", "speculation"
    )
    use_heterogeneous_vocab: bool = declare(
        False, "bool", "a draft model with another vocabulary", "speculation"
    )
    draft_lm_head_quantization: str | None = declare(
        None,
        "enum",
        "quantization of the draft's LM head",
        "speculation",
        DRAFT_LM_HEAD_QUANTIZATIONS,
    )
    draft_architecture: str | None = declare(
        None,
        "str",
        "the draft model's HF `architectures[0]`, before vLLM renames an EAGLE draft's (read "
        "from `--speculative-config`'s `model` config.json; None: unknown)",
        "speculation",
    )
    draft_mixed_attention: bool = declare(
        False, "bool", "the draft mixes sliding-window and full attention layers", "speculation"
    )
    draft_is_moe: bool | None = declare(
        None,
        "opt_bool",
        "the draft model is a mixture of experts (read from `--speculative-config`'s `model` "
        "config.json; None: unknown)",
        "speculation",
    )
    draft_vocab_size: int | None = declare(
        None,
        "int",
        "the draft model's HF `vocab_size` (read from `--speculative-config`'s `model` "
        "config.json; None: unknown)",
        "speculation",
        minimum=0,
    )
    # parallelism
    tensor_parallel_size: int = declare(1, "int", "tensor parallel size", "parallelism", minimum=1)
    pipeline_parallel_size: int = declare(
        1, "int", "pipeline parallel size", "parallelism", minimum=1
    )
    data_parallel_size: int = declare(1, "int", "data parallel size", "parallelism", minimum=1)
    prefill_context_parallel_size: int = declare(
        1, "int", "prefill context parallel size", "parallelism", minimum=1
    )
    decode_context_parallel_size: int = declare(
        1, "int", "decode context parallel size", "parallelism", minimum=1
    )
    enable_expert_parallel: bool = declare(
        False, "bool", "expert parallelism for MoE layers", "parallelism"
    )
    enable_sequence_parallelism: bool = declare(
        False, "bool", "sequence parallelism pass", "parallelism"
    )
    distributed_executor_backend: str | None = declare(
        None, "enum", "executor backend (None: vLLM's default)", "parallelism", EXECUTOR_BACKENDS
    )
    enable_dbo: bool = declare(False, "bool", "dual batch overlap", "parallelism")
    ubatch_size: int = declare(0, "int", "micro-batch count for DBO (0: default)", "parallelism")
    enable_elastic_ep: bool = declare(False, "bool", "elastic expert parallelism", "parallelism")
    enable_eplb: bool = declare(False, "bool", "expert-parallel load balancer", "parallelism")
    enable_batch_sharded_sampling: bool = declare(
        False, "bool", "sampling sharded by batch across tensor-parallel ranks", "parallelism"
    )
    all2all_backend: str | None = declare(
        None,
        "enum",
        "MoE all-to-all backend (None: vLLM's default)",
        "parallelism",
        ALL2ALL_BACKENDS,
    )
    # compile
    compilation_mode: str = declare(
        "vllm_compile", "enum", "compilation mode", "compile", COMPILATION_MODES
    )
    cudagraph_mode: str | None = declare(
        None, "enum", "CUDA graph mode (None: vLLM's default)", "compile", CUDAGRAPH_MODES
    )
    enforce_eager: bool = declare(False, "bool", "no CUDA graphs", "compile")
    # features
    logits_processors: tuple[str, ...] = declare(
        (), "list", "custom logits processors configured (qualified names)", "features"
    )
    logits_processor_plugins: tuple[str, ...] = declare(
        (),
        "list",
        "logits processors found as installed entry points (`vllm.logits_processors`)",
        "features",
    )
    kv_sharing_fast_prefill: bool = declare(False, "bool", "KV-sharing fast prefill", "features")
    mamba_cache_mode: str | None = declare(
        None,
        "enum",
        "Mamba prefix-cache mode (None: vLLM's default)",
        "features",
        MAMBA_CACHE_MODES,
    )
    cpu_offload_gb: float = declare(
        0.0, "float", "GiB of weights offloaded to CPU memory", "features"
    )
    kv_transfer_config: Mapping[str, Any] | None = declare(
        None,
        "json",
        "vLLM's `--kv-transfer-config` object (`kv_connector`, `kv_role`, ...)",
        "features",
    )
    mm_encoder_only: bool = declare(False, "bool", "serve only the multimodal encoder", "features")
    async_scheduling: bool | None = declare(
        None, "opt_bool", "async scheduling (None: not set explicitly)", "features"
    )
    enable_prefix_caching: bool | None = declare(
        None, "opt_bool", "prefix caching (None: vLLM's default)", "features"
    )
    lora: bool = declare(False, "bool", "LoRA adapters enabled", "features")
    hisparse: bool = declare(False, "bool", "HiSparse attention", "features")
    watermark: bool = declare(False, "bool", "output watermarking", "features")
    # environment
    env: Mapping[str, str] = declare(
        FrozenMap(), "env", "runner-selection environment variables (name -> value)", "env"
    )
    _hash: int = field(init=False, compare=False, default=0)

    def __post_init__(self) -> None:
        for name, check, info, default in _CHECKS:
            raw = getattr(self, name)
            value = default if raw is None else check(info, raw)
            if value is not raw:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, n) for n in CONFIG_FIELD_NAMES)))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"DeploymentConfig({', '.join(f'{k}={v!r}' for k, v in self.changed().items())})"

    # -- views -------------------------------------------------------------------------------

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults (what a spec would need to say)."""
        out: dict[str, Any] = {}
        for name in CONFIG_FIELD_NAMES:
            value = getattr(self, name)
            if value != DEFAULTS[name]:
                out[name] = thaw(value)
        return out

    def to_spec(self) -> dict[str, Any]:
        """A JSON-ready spec that :func:`oracle.sources.from_spec` turns back into an equal
        config."""
        out = self.changed()
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out

    def replace(self, **changes: Any) -> DeploymentConfig:
        """A copy with ``changes`` applied (checked like the constructor). Raises ConfigError
        (``unknown_field``, with the closest field name) for a name that is not a field."""
        for name in changes:
            if name not in _FIELD_SET:
                coerce_field(name, None)  # raises the unknown_field error, "did you mean"
        return dataclasses.replace(self, **changes)

    def _trusted_replace(self, changes: Mapping[str, Any]) -> DeploymentConfig:
        """A copy with ``changes`` that are already checked (values from a pack's validated
        domains); skips the per-field checks, for enumerating many cells fast."""
        new = object.__new__(DeploymentConfig)
        values = []
        for name in CONFIG_FIELD_NAMES:
            value = changes[name] if name in changes else getattr(self, name)
            object.__setattr__(new, name, value)
            values.append(value)
        object.__setattr__(new, "_hash", hash(tuple(values)))
        return new

    def runner_env(self, name: str) -> str | None:
        """The value of the runner-selection variable ``name``, or None when unset."""
        return self.env.get(name)


FIELDS: tuple[FieldInfo, ...] = field_infos(DeploymentConfig)
"""Every field's metadata, in declaration order (derived from the dataclass)."""
FIELD_INFO: dict[str, FieldInfo] = {f.name: f for f in FIELDS}
_UNDECLARED = [
    f.name for f in dataclasses.fields(DeploymentConfig) if f.init and f.name not in FIELD_INFO
]
if _UNDECLARED:  # a field without declare() would escape the checks, the docs and the matrix
    raise TypeError(f"DeploymentConfig fields without declare(): {', '.join(_UNDECLARED)}")
CONFIG_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)
DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(DeploymentConfig) if f.name in FIELD_INFO
}
_FIELD_SET = frozenset(CONFIG_FIELD_NAMES)
# The coercion table: each field's check (its own, else its kind's), with its default.
_CHECKS: tuple[tuple[str, Check, FieldInfo, Any], ...] = tuple(
    (f.name, f.check or KIND_CHECKS[f.kind], f, DEFAULTS[f.name]) for f in FIELDS
)


def coerce_field(name: str, value: Any) -> Any:
    """The checked value of field ``name`` (None stays None; the constructor then takes the
    default). Raises ConfigError: ``unknown_field`` (with the closest name) or ``bad_value``."""
    info = FIELD_INFO.get(name)
    if info is None:
        raise ConfigError(
            f"unknown field {name!r}{suggest(name, CONFIG_FIELD_NAMES)}",
            code=ErrorCode.UNKNOWN_FIELD,
            field=name,
        )
    if value is None:
        return None
    return (info.check or KIND_CHECKS[info.kind])(info, value)
