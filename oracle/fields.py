"""The dimensions of a deployment: name, kind, closed vocabulary and meaning of every field.

Field names follow vLLM's engine arguments where one exists (DESIGN §3.1). ``None`` for a model
attribute means "take it from the pack's families.yaml"; ``None`` for ``async_scheduling`` means
"not set explicitly" (vLLM only refuses some combinations when the user asked for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["bool", "opt_bool", "int", "float", "str", "enum", "list", "env"]


@dataclass(frozen=True)
class FieldInfo:
    """Metadata of one DeploymentConfig field.

    ``vocab`` is the closed domain of an ``enum`` field (None: open). ``changeable`` says whether
    ``explain`` may suggest changing it (deployment options yes, model facts no).
    """

    name: str
    kind: Kind
    doc: str
    group: str
    vocab: tuple[str, ...] | None = None
    changeable: bool = True


PLATFORMS = ("cuda", "rocm", "cpu", "xpu", "tpu", "npu")
# vLLM's speculative methods after argument resolution: model-specific MTP names (deepseek_mtp,
# qwen3_next_mtp, ...) resolve to "mtp" (vllm/config/speculative.py); "none" = no speculation.
SPECULATIVE_METHODS = (
    "none", "ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator", "draft_model", "eagle",
    "eagle3", "mtp", "dflash", "dspark", "extract_hidden_states", "custom_class",
)
# vLLM CompilationMode names (vllm/config/compilation.py), lower-cased.
COMPILATION_MODES = ("none", "stock_torch_compile", "dynamo_trace_once", "vllm_compile")
CUDAGRAPH_MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")
MAMBA_CACHE_MODES = ("none", "align", "all")
RUNNER_KINDS = ("generate", "pooling")

_F = FieldInfo
FIELDS: tuple[FieldInfo, ...] = (
    # identity and model
    _F("deployment_id", "str", "stable id of the deployment (sticky percentage canaries)",
       "identity", changeable=False),
    _F("model", "str", "model id or path as given (display only)", "model", changeable=False),
    _F("architecture", "str", "HF architectures[0]", "model", changeable=False),
    _F("model_type", "str", "HF model_type (informational)", "model", changeable=False),
    _F("family", "str", "family override (normally from families.yaml)", "model",
       changeable=False),
    _F("quantization", "str", "quantization method ('none' when unquantized)", "model"),
    _F("runner_kind", "enum", "generate or pooling (vLLM --runner)", "model", RUNNER_KINDS),
    _F("is_moe", "opt_bool", "mixture of experts", "model", changeable=False),
    _F("use_mla", "opt_bool", "multi-head latent attention", "model", changeable=False),
    _F("has_inner_state", "opt_bool", "recurrent state (Mamba, linear attention)", "model",
       changeable=False),
    _F("is_hybrid", "opt_bool", "attention mixed with state-space layers", "model",
       changeable=False),
    _F("attention_free", "opt_bool", "no attention layers at all", "model", changeable=False),
    _F("is_multimodal", "opt_bool", "multimodal inputs", "model", changeable=False),
    _F("is_encoder_decoder", "opt_bool", "encoder-decoder model", "model", changeable=False),
    _F("is_diffusion", "opt_bool", "diffusion language model", "model", changeable=False),
    # platform
    _F("platform", "enum", "accelerator platform", "platform", PLATFORMS),
    _F("triton_available", "bool", "Triton importable on the host", "platform"),
    # speculation
    _F("speculative_method", "enum", "speculative decoding method", "speculation",
       SPECULATIVE_METHODS),
    _F("num_speculative_tokens", "int", "draft tokens per step (0 without speculation)",
       "speculation"),
    _F("parallel_drafting", "bool", "draft all tokens in one pass", "speculation"),
    # parallelism
    _F("tensor_parallel_size", "int", "tensor parallel size", "parallelism"),
    _F("pipeline_parallel_size", "int", "pipeline parallel size", "parallelism"),
    _F("data_parallel_size", "int", "data parallel size", "parallelism"),
    _F("prefill_context_parallel_size", "int", "prefill context parallel size", "parallelism"),
    _F("decode_context_parallel_size", "int", "decode context parallel size", "parallelism"),
    _F("enable_expert_parallel", "bool", "expert parallelism for MoE layers", "parallelism"),
    _F("enable_sequence_parallelism", "bool", "sequence parallelism pass", "parallelism"),
    _F("distributed_executor_backend", "enum", "executor backend (None: vLLM's default)",
       "parallelism", EXECUTOR_BACKENDS),
    _F("enable_dbo", "bool", "dual batch overlap", "parallelism"),
    _F("ubatch_size", "int", "micro-batch count for DBO (0: default)", "parallelism"),
    _F("enable_elastic_ep", "bool", "elastic expert parallelism", "parallelism"),
    _F("enable_eplb", "bool", "expert-parallel load balancer", "parallelism"),
    # compile
    _F("compilation_mode", "enum", "compilation mode", "compile", COMPILATION_MODES),
    _F("cudagraph_mode", "enum", "CUDA graph mode (None: vLLM's default)", "compile",
       CUDAGRAPH_MODES),
    _F("enforce_eager", "bool", "no CUDA graphs", "compile"),
    # features
    _F("logits_processors", "list", "custom logits processors configured (qualified names)",
       "features"),
    _F("logits_processor_plugins", "list",
       "logits processors found as installed entry points (vllm.logits_processors)", "features"),
    _F("kv_sharing_fast_prefill", "bool", "KV-sharing fast prefill", "features"),
    _F("mamba_cache_mode", "enum", "Mamba prefix-cache mode (None: vLLM's default)",
       "features", MAMBA_CACHE_MODES),
    _F("cpu_offload_gb", "float", "GiB of weights offloaded to CPU memory", "features"),
    _F("kv_transfer_config", "bool", "a KV transfer (disaggregated prefill) config is set",
       "features"),
    _F("async_scheduling", "opt_bool", "async scheduling (None: not set explicitly)",
       "features"),
    _F("enable_prefix_caching", "opt_bool", "prefix caching (None: vLLM's default)", "features"),
    _F("lora", "bool", "LoRA adapters enabled", "features"),
    _F("hisparse", "bool", "HiSparse attention", "features"),
    _F("watermark", "bool", "output watermarking", "features"),
    # environment
    _F("env", "env", "runner-selection environment variables (name -> value)", "env"),
)

FIELD_INFO: dict[str, FieldInfo] = {f.name: f for f in FIELDS}

# Model attributes that families.yaml supplies when the config leaves them None.
FAMILY_ATTRIBUTES: tuple[str, ...] = (
    "is_moe", "use_mla", "has_inner_state", "is_hybrid", "attention_free", "is_multimodal",
    "is_encoder_decoder", "is_diffusion", "runner_kind",
)

# Dimensions computed from the config and its family, usable in rules and cohorts.
DERIVED_DIMENSIONS: dict[str, str] = {
    "family": "the family of the architecture (families.yaml), or the config's override",
    "quantized": "quantization is not 'none'",
    "pooling": "runner_kind is 'pooling'",
    "runner_pin": "the pack's runner variable: 'auto' (unset), 'v1' or 'v2'",
}
RUNNER_PINS = ("auto", "v1", "v2")
