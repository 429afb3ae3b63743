"""DeploymentConfig fields from a Hugging Face ``config.json``.

Only facts the file states are used: ``architectures[0]``, ``model_type``,
``quantization_config.quant_method``, expert counts (MoE), ``kv_lora_rank`` (MLA),
``is_encoder_decoder``, vision/audio sub-configs (multimodal) and Mamba / linear-attention
layer types (inner state). Anything the file does not say is left to families.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oracle.config import DeploymentConfig
from oracle.errors import ConfigError, ErrorCode, PackError
from oracle.yamlpos import read_text

# HF config keys that count routed experts, per model family (transformers configuration_*.py).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_INNER_STATE_LAYERS = {"mamba", "mamba2", "linear_attention", "conv", "ssm"}
# quant_method values normalised to vLLM's --quantization names.
_QUANT_ALIASES = {"compressed_tensors": "compressed-tensors", "bitsandbytes": "bitsandbytes",
                  "modelopt": "modelopt"}


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed config.json at ``path`` (a file or a model directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(read_text(p))
    except PackError as exc:
        raise ConfigError(str(exc.issues[0]), code=ErrorCode.BAD_SPEC) from None
    except OSError as exc:
        raise ConfigError(f"cannot read HF config {p}: {exc.strerror or exc}",
                          code=ErrorCode.FILE_NOT_FOUND) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}",
                          code=ErrorCode.BAD_SPEC) from None
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
    return _QUANT_ALIASES.get(method, method)


def hf_config_to_fields(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """DeploymentConfig keyword arguments for a config.json (path, directory or mapping).

    Raises ConfigError when the file cannot be read or names no architecture.
    """
    data = _unwrap(source if isinstance(source, Mapping) else read_hf_config(source))
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError("the HF config has no 'architectures' list; pass --architecture",
                          code=ErrorCode.BAD_SPEC, field="architectures")
    raw_text = data.get("text_config")
    text: Mapping[str, Any] = raw_text if isinstance(raw_text, Mapping) else {}
    fields: dict[str, Any] = {"architecture": archs[0]}
    if isinstance(data.get("model_type"), str):
        fields["model_type"] = data["model_type"]
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
    layer_types = data.get("layer_types") or text.get("layer_types") or []
    if isinstance(layer_types, list) and _INNER_STATE_LAYERS & set(map(str, layer_types)):
        fields["has_inner_state"] = True
        fields["is_hybrid"] = any(t in ("attention", "full_attention") for t in layer_types)
    return fields


def from_hf_config(path_or_mapping: str | Path | Mapping[str, Any],
                   **overrides: Any) -> DeploymentConfig:
    """A DeploymentConfig from a local HF ``config.json`` (a file, its directory, or the parsed
    mapping).

    Sets architecture, model_type, quantization and the model attributes the config shows
    (is_moe from expert counts, use_mla from kv_lora_rank, ...); ``overrides`` win. Raises
    ConfigError when the file cannot be read or names no architecture.
    """
    fields = hf_config_to_fields(path_or_mapping)
    fields.update(overrides)
    return DeploymentConfig(**fields)
