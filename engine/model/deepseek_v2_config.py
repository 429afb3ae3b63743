"""DeepSeek-V2's attention fields, kept out of the flat :class:`ModelConfig`: multi-head latent
attention (MLA) ranks and head sizes, and its YaRN RoPE scaling.

``read_mla_config(d)`` reads them from an HF ``config.json`` mapping (transformers'
``DeepseekV2Config`` field names; both RoPE spellings, ``rope_scaling`` and transformers 5's
``rope_parameters``) and gives the mapping the flat fields are read from: RoPE scaling taken out
(it applies to the rotary part of each head only, and lives here), ``head_dim`` set to
``qk_rope_head_dim`` as transformers' ``DeepseekV2Config`` sets it. Anything not implemented is
refused with :class:`ModelConfigError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from turnout.engine.model.config import ModelConfigError

#: Architectures whose attention is MLA, with their ``model_type``.
MLA_ARCHITECTURES = {"DeepseekV2ForCausalLM": "deepseek_v2"}


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (Peng et al. 2023, arXiv:2309.00071) as DeepSeek-V2 configures it.

    Numerics follow transformers' ``_compute_yarn_parameters`` (modeling_rope_utils.py) and
    ``yarn_apply_mscale`` (modeling_deepseek_v2.py): ``factor`` ``None`` means
    ``max_position_embeddings / original_max_position_embeddings``; ``truncate`` floors/ceils
    the correction range (transformers' default, and DeepSeek's own code).
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0  # 0: not set
    mscale_all_dim: float = 0.0  # 0: not set
    attention_factor: float | None = None
    truncate: bool = True

    @property
    def cos_sin_scale(self) -> float:
        """The factor on the cos/sin tables (transformers' ``attention_factor``):
        ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set, else
        ``mscale(factor)``. (DeepSeek's own code and vLLM divide by
        ``mscale(factor, mscale_all_dim)`` even when only ``mscale`` is set; released configs
        set both, where the two agree.)"""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return yarn_mscale(self.factor)

    @property
    def softmax_scale_factor(self) -> float:
        """``mscale(factor, mscale_all_dim) ** 2`` when ``mscale_all_dim`` is set, else 1: the
        correction DeepSeek-V2 multiplies into the softmax scale (``yarn_apply_mscale``)."""
        if not self.mscale_all_dim:
            return 1.0
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2

    def to_hf_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "rope_type": "yarn",
            "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
            "mscale": self.mscale,
            "mscale_all_dim": self.mscale_all_dim,
            "truncate": self.truncate,
        }
        if self.attention_factor is not None:
            d["attention_factor"] = self.attention_factor
        return d


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2 paper, arXiv:2405.04434 §2.1).

    Each head's query is ``[q_nope (qk_nope_head_dim), q_pe (qk_rope_head_dim)]``, from
    ``q_proj`` or, with ``q_lora_rank``, ``q_b_proj(q_a_layernorm(q_a_proj(x)))``. Keys and
    values come from one compressed row per token: ``kv_a_proj_with_mqa(x)`` gives ``c_kv``
    (``kv_lora_rank``, normalised by ``kv_a_layernorm``) and a rotary key ``k_pe`` shared by all
    heads; ``kv_b_proj(c_kv)`` expands per head ``k_nope`` and ``v`` (``v_head_dim``).
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_scaling: YarnScaling | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values the paged cache keeps per token and layer: ``c_kv`` then ``k_pe``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim ** -0.5``, times YaRN's ``mscale(factor, mscale_all_dim) ** 2``."""
        factor = self.rope_scaling.softmax_scale_factor if self.rope_scaling else 1.0
        scale: float = self.qk_head_dim**-0.5 * factor
        return scale

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` fields of this block (legacy ``rope_scaling`` spelling)."""
        return {
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": self.q_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "rope_scaling": self.rope_scaling.to_hf_dict() if self.rope_scaling else None,
        }


def read_mla_config(d: Mapping[str, Any]) -> tuple[MLAConfig, dict[str, Any]]:
    """The :class:`MLAConfig` of an HF mapping, and the mapping to read the flat
    :class:`ModelConfig` fields from.

    Raises:
        ModelConfigError: a rank or head size missing or not a positive integer, a RoPE type
            other than default/yarn, a YaRN field missing, ``sliding_window``, or a
            ``quantization_config``.
    """
    q_lora_rank = d.get("q_lora_rank")
    mla = MLAConfig(
        kv_lora_rank=_positive(d, "kv_lora_rank"),
        qk_nope_head_dim=_positive(d, "qk_nope_head_dim"),
        qk_rope_head_dim=_positive(d, "qk_rope_head_dim"),
        v_head_dim=_positive(d, "v_head_dim"),
        q_lora_rank=None if q_lora_rank is None else _positive(d, "q_lora_rank"),
        rope_scaling=_yarn(d),
    )
    if d.get("quantization_config") is not None:
        raise ModelConfigError(
            "quantization_config is not supported for DeepseekV2ForCausalLM: its "
            "latent attention absorbs kv_b_proj's weights as dense matrices"
        )
    if d.get("sliding_window"):
        raise ModelConfigError(
            "sliding_window is not supported with multi-head latent attention; remove it"
        )
    if mla.qk_rope_head_dim % 2:
        raise ModelConfigError(
            f"qk_rope_head_dim must be even (rotary pairs), got {mla.qk_rope_head_dim}"
        )
    flat = {k: v for k, v in d.items() if k not in ("rope_scaling", "rope_parameters")}
    flat["rope_theta"] = _theta(d)
    flat["head_dim"] = mla.qk_rope_head_dim  # as transformers' DeepseekV2Config sets it
    return mla, flat


def _positive(d: Mapping[str, Any], key: str) -> int:
    value = d.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelConfigError(f"config field `{key}` must be a positive integer, got {value!r}")
    return value


def _rope_mapping(d: Mapping[str, Any]) -> Mapping[str, Any] | None:
    params = d.get("rope_parameters")
    if isinstance(params, Mapping):
        return params
    scaling = d.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ModelConfigError(f"rope_scaling must be a mapping, got {scaling!r}")
    return scaling


def _theta(d: Mapping[str, Any]) -> float:
    params = d.get("rope_parameters")
    theta = (
        params.get("rope_theta", d.get("rope_theta", 10000.0))
        if isinstance(params, Mapping)
        else d.get("rope_theta", 10000.0)
    )
    return float(theta)


def _yarn(d: Mapping[str, Any]) -> YarnScaling | None:
    scaling = _rope_mapping(d)
    if not scaling:
        return None
    rope_type = str(scaling.get("rope_type") or scaling.get("type") or "default")
    if rope_type == "default":
        return None
    if rope_type != "yarn":
        raise ModelConfigError(
            f"rope_scaling type {rope_type!r} is not implemented for "
            "DeepseekV2ForCausalLM; supported: default, yarn"
        )
    if "original_max_position_embeddings" not in scaling:
        raise ModelConfigError("yarn rope_scaling needs `original_max_position_embeddings`")
    original = int(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor")
    if factor is None:  # transformers: the ratio of the two context lengths
        factor = _positive(d, "max_position_embeddings") / original
    attention_factor = scaling.get("attention_factor")
    return YarnScaling(
        factor=float(factor),
        original_max_position_embeddings=original,
        beta_fast=float(scaling.get("beta_fast") or 32),
        beta_slow=float(scaling.get("beta_slow") or 1),
        mscale=float(scaling.get("mscale") or 0.0),
        mscale_all_dim=float(scaling.get("mscale_all_dim") or 0.0),
        attention_factor=None if attention_factor is None else float(attention_factor),
        truncate=bool(scaling.get("truncate", True)),
    )


__all__ = ["MLA_ARCHITECTURES", "MLAConfig", "YarnScaling", "read_mla_config", "yarn_mscale"]
