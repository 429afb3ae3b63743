"""DeploymentConfig fields from a Hugging Face ``config.json``, read as vLLM reads it.

Only facts the file states are used: ``architectures[0]``, ``model_type``, ``hidden_size``
(of ``text_config`` when there is one, as vLLM's ``hf_text_config``),
``quantization_config.quant_method`` (with vLLM's ModelOpt overrides), expert counts (MoE),
``kv_lora_rank`` (MLA), ``index_topk`` (a sparse-attention indexer: present or not, as vLLM's
``hasattr`` check reads it), ``is_encoder_decoder``, vision/audio sub-configs (multimodal) and
Mamba / linear-attention layers (inner state, hybrid, attention-free). What the file does not
say (pooling runners, ``supports_mamba_prefix_caching``, a model class's own flags) is left to
the pack's families.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnout.oracle import bounded_json
from turnout.oracle.config import DeploymentConfig
from turnout.oracle.errors import ConfigError, ErrorCode, PackError
from turnout.oracle.yamlpos import read_text

# HF config keys that count routed experts, per model family (transformers configuration_*.py).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_INNER_STATE_LAYERS = {"mamba", "mamba2", "linear_attention", "conv", "ssm"}
_ATTENTION_LAYERS = {"attention", "full_attention", "sliding_attention", "hybrid"}
# model_type of attention-free state-space models (transformers configuration_*.py).
_ATTENTION_FREE_TYPES = {"mamba", "mamba2", "falcon_mamba"}
# vLLM's ModelOpt configs rename quant_method "modelopt" by quant_algo
# (vllm/model_executor/layers/quantization/modelopt.py, override_quantization_method).
_MODELOPT_ALGOS = (
    ("MXFP8", "modelopt_mxfp8"),
    ("MIXED_PRECISION", "modelopt_mixed"),
    ("FP4", "modelopt_fp4"),
    ("FP8", "modelopt"),
)
# quant_method values normalised to vLLM's --quantization names.
_QUANT_ALIASES = {
    "compressed_tensors": "compressed-tensors",
    "bitsandbytes": "bitsandbytes",
    "modelopt": "modelopt",
}


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed config.json at ``path`` (a file or a model directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = bounded_json.loads(read_text(p))
    except PackError as exc:
        raise ConfigError(str(exc.issues[0]), code=ErrorCode.BAD_SPEC) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read HF config {p}: {exc.strerror or exc}", code=ErrorCode.FILE_NOT_FOUND
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}", code=ErrorCode.BAD_SPEC
        ) from None
    except bounded_json.TooDeepError as exc:
        raise ConfigError(f"{p}: {exc}", code=ErrorCode.BAD_SPEC) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object", code=ErrorCode.BAD_SPEC)
    return data


def _unwrap(data: Mapping[str, Any]) -> Mapping[str, Any]:
    # policies/reference/model_configs/*.json keep the HF config under "config", with provenance.
    if "architectures" not in data and isinstance(data.get("config"), Mapping):
        return data["config"]  # type: ignore[no-any-return]
    return data


def _count_experts(cfg: Mapping[str, Any]) -> int:
    for key in _EXPERT_KEYS:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _quantization(cfg: Mapping[str, Any]) -> str | None:
    qc = cfg.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    method = qc.get("quant_method")
    if not isinstance(method, str) or not method:
        return None
    method = method.lower()
    if method.startswith("modelopt"):
        inner = qc.get("quantization")
        algo = str((inner if isinstance(inner, Mapping) else qc).get("quant_algo", "")).upper()
        for needle, name in _MODELOPT_ALGOS:
            if needle == algo or (needle in ("MXFP8", "FP4") and needle in algo):
                return name
    return _QUANT_ALIASES.get(method, method)


def _hidden_size(cfg: Mapping[str, Any]) -> int | None:
    for key in ("hidden_size", "d_model", "n_embd"):  # transformers' attribute_map aliases
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _count(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of ``keys`` that ``cfg`` holds as a non-negative integer."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


#: Where vLLM reads the head counts: transformers' ``num_attention_heads`` (the attribute maps
#: of GPT-2 and others spell it ``n_head``), and for the KV heads the attributes its
#: ``get_total_num_kv_heads`` tries in order, falling back to the attention heads (vLLM 0.29
#: vllm/transformers_utils/model_arch_config_convertor.py).
_ATTENTION_HEADS = ("num_attention_heads", "n_head", "n_heads")
_KV_HEADS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)


def _heads(data: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, int]:
    cfg = text or data
    heads = _count(cfg, _ATTENTION_HEADS)
    if heads is None:
        # An attention-free model (Mamba) has no heads: vLLM reads 0 for both
        # (get_total_num_attention_heads's default; the KV heads fall back to it).
        model_type = text.get("model_type") or data.get("model_type")
        attention_free = model_type in _ATTENTION_FREE_TYPES
        return {"num_attention_heads": 0, "num_key_value_heads": 0} if attention_free else {}
    kv = _count(cfg, _KV_HEADS)
    return {"num_attention_heads": heads, "num_key_value_heads": heads if kv is None else kv}


def _state_layers(data: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, bool]:
    """has_inner_state / is_hybrid / attention_free from the layer layout the file states."""
    model_type = text.get("model_type") or data.get("model_type")
    if model_type in _ATTENTION_FREE_TYPES:
        return {"has_inner_state": True, "attention_free": True}
    layers = (
        data.get("layer_types")
        or text.get("layer_types")
        or data.get("layers_block_type")
        or text.get("layers_block_type")
    )
    kinds = set(map(str, layers)) if isinstance(layers, list) else set()
    pattern = data.get("hybrid_override_pattern") or text.get("hybrid_override_pattern")
    if isinstance(pattern, str):  # NemotronH: M = Mamba-2, * = attention, - = MLP
        kinds |= {"mamba"} if "M" in pattern else set()
        kinds |= {"attention"} if "*" in pattern else set()
    if "attn_layer_period" in data and any(k.startswith("mamba_") for k in data):  # Jamba
        kinds |= {"mamba", "attention"}
    if not kinds & _INNER_STATE_LAYERS:
        return {}
    return {"has_inner_state": True, "is_hybrid": bool(kinds & _ATTENTION_LAYERS)}


def hf_config_to_fields(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """DeploymentConfig keyword arguments for a config.json (path, directory or mapping).

    Raises ConfigError when the file cannot be read or names no architecture.
    """
    data = _unwrap(source if isinstance(source, Mapping) else read_hf_config(source))
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(
            "the HF config has no 'architectures' list; pass --architecture",
            code=ErrorCode.BAD_SPEC,
            field="architectures",
        )
    raw_text = data.get("text_config")
    text: Mapping[str, Any] = raw_text if isinstance(raw_text, Mapping) else {}
    fields: dict[str, Any] = {"architecture": archs[0]}
    if isinstance(data.get("model_type"), str):
        fields["model_type"] = data["model_type"]
    hidden = _hidden_size(text) or _hidden_size(data)
    if hidden is not None:
        fields["hidden_size"] = hidden
    fields.update(_heads(data, text))
    vocab = _count(text, ("vocab_size",)) or _count(data, ("vocab_size",))
    if vocab is not None:
        fields["vocab_size"] = vocab
    fields["has_index_topk"] = "index_topk" in data  # vLLM: hasattr(hf_config, "index_topk")
    quant = _quantization(data) or _quantization(text)
    if quant:
        fields["quantization"] = quant
    if _count_experts(data) or _count_experts(text):
        fields["is_moe"] = True
    if data.get("kv_lora_rank") is not None or text.get("kv_lora_rank") is not None:
        fields["use_mla"] = True
    if data.get("is_encoder_decoder") is True:
        fields["is_encoder_decoder"] = True
    if any(isinstance(data.get(k), Mapping) for k in ("vision_config", "audio_config")):
        fields["is_multimodal"] = True
    fields.update(_state_layers(data, text))
    return fields


def from_hf_config(
    path_or_mapping: str | Path | Mapping[str, Any], **overrides: Any
) -> DeploymentConfig:
    """A DeploymentConfig from a local HF ``config.json`` (a file, its directory, or the parsed
    mapping).

    Sets architecture, model_type, hidden_size, quantization and the model attributes the
    config shows (is_moe from expert counts, use_mla from kv_lora_rank, has_index_topk from
    index_topk, ...); ``overrides`` win. Raises
    ConfigError when the file cannot be read or names no architecture.
    """
    fields = hf_config_to_fields(path_or_mapping)
    fields.update(overrides)
    return DeploymentConfig(**fields)
