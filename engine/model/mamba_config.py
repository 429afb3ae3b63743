"""Config facts of the state-space models: Mamba-1 (``MambaForCausalLM``) and the Jamba hybrid
(``JambaForCausalLM``: attention, Mamba and MoE layers by period and offset).

HF's ``MambaConfig`` spells the model's fields its own way (``state_size``, ``conv_kernel``,
``time_step_rank``, ``layer_norm_epsilon``) and has no attention heads nor a maximum length;
:func:`mamba_model_config` maps them onto :class:`~engine.model.config.ModelConfig` with the
mixer's own facts in the nested :class:`MambaConfig`. Sources: transformers 5.24
``models/mamba/configuration_mamba.py`` and ``models/jamba/configuration_jamba.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAMBA_ARCHITECTURES = ("MambaForCausalLM", "JambaForCausalLM")
#: vLLM's ``max_model_len`` when a config names no maximum length (Mamba has none):
#: ``vllm/config/model.py`` ``_get_and_verify_max_len`` falls back to 2048.
DEFAULT_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class MambaConfig:
    """The Mamba-1 mixer of every Mamba layer (Gu & Dao 2023, arXiv:2312.00752).

    Attributes:
        d_inner: channels of the mixer (``intermediate_size``; ``expand * hidden_size``).
        d_state: SSM state per channel (``state_size`` / ``mamba_d_state``).
        d_conv: causal conv1d width (``conv_kernel`` / ``mamba_d_conv``).
        dt_rank: rank of the time-step projection (``time_step_rank`` / ``mamba_dt_rank``).
        proj_bias: biases on ``in_proj`` and ``out_proj`` (``use_bias`` / ``mamba_proj_bias``).
        conv_bias: a bias on the conv (``use_conv_bias`` / ``mamba_conv_bias``).
        residual_in_fp32: Mamba keeps the residual stream in float32 (Jamba does not).
        inner_layernorms: Jamba's RMSNorms on the time step, B and C (``dt_layernorm``,
            ``b_layernorm``, ``c_layernorm``).
        attn_layer_period, attn_layer_offset: Jamba's attention layers (``i % period ==
            offset``); ``0, 0`` for Mamba (no attention layer).
    """

    d_inner: int
    d_state: int
    d_conv: int
    dt_rank: int
    proj_bias: bool = False
    conv_bias: bool = True
    residual_in_fp32: bool = True
    inner_layernorms: bool = False
    attn_layer_period: int = 0
    attn_layer_offset: int = 0

    def is_attention_layer(self, layer: int) -> bool:
        """True for Jamba's attention layers, False for every Mamba layer."""
        period = self.attn_layer_period
        return period > 0 and layer % period == self.attn_layer_offset

    def layer_kinds(self, num_layers: int) -> tuple[str, ...]:
        """``"attention"`` or ``"mamba"`` for each layer."""
        return tuple(
            "attention" if self.is_attention_layer(i) else "mamba" for i in range(num_layers)
        )


def _positive(d: Mapping[str, Any], key: str, default: int | None = None, *, least: int = 1) -> int:
    from turnout.engine.model.config import ModelConfigError

    value = d.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ModelConfigError(f"config field `{key}` must be {what}, got {value!r}")
    return value


def _dt_rank(d: Mapping[str, Any], key: str, hidden_size: int) -> int:
    # HF's "auto": ceil(hidden_size / 16) (MambaConfig and JambaConfig alike)
    if d.get(key, "auto") == "auto":
        return math.ceil(hidden_size / 16)
    return _positive(d, key)


def mamba_model_config(arch: str, d: Mapping[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a Mamba or Jamba config (``common``: the shared fields read by
    ``engine.model.config``, without the attention ones for Mamba).

    Raises:
        ModelConfigError: a missing or invalid field, an activation other than SiLU, Jamba's
            ``mamba_inner_layernorms: false`` or a ``sliding_window`` (neither is part of
            transformers' Jamba), or an invalid MoE field (``engine.model.moe_config``).
    """
    from turnout.engine.model.config import ModelConfigError

    if common.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"hidden_act {common['hidden_act']!r}: {arch} supports 'silu'")
    h = common["hidden_size"]
    if arch == "MambaForCausalLM":
        mamba = MambaConfig(
            d_inner=_positive(d, "intermediate_size"),
            d_state=_positive(d, "state_size", 16),
            d_conv=_positive(d, "conv_kernel", 4, least=2),
            dt_rank=_dt_rank(d, "time_step_rank", h),
            proj_bias=bool(d.get("use_bias", False)),
            conv_bias=bool(d.get("use_conv_bias", True)),
            residual_in_fp32=bool(d.get("residual_in_fp32", True)),
        )
        return dict(
            num_key_value_heads=1,
            head_dim=1,
            rms_norm_eps=float(d.get("layer_norm_epsilon", 1e-5)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
            mamba=mamba,
        )
    mamba = MambaConfig(
        d_inner=_positive(d, "mamba_expand", 2) * h,
        d_state=_positive(d, "mamba_d_state", 16),
        d_conv=_positive(d, "mamba_d_conv", 4, least=2),
        dt_rank=_dt_rank(d, "mamba_dt_rank", h),
        proj_bias=bool(d.get("mamba_proj_bias", False)),
        conv_bias=bool(d.get("mamba_conv_bias", True)),
        residual_in_fp32=False,
        inner_layernorms=True,
        attn_layer_period=_positive(d, "attn_layer_period", 8),
        attn_layer_offset=int(d.get("attn_layer_offset", 4)),
    )
    if not 0 <= mamba.attn_layer_offset < mamba.attn_layer_period:
        raise ModelConfigError(
            f"attn_layer_offset ({mamba.attn_layer_offset}) must be in [0, attn_layer_period="
            f"{mamba.attn_layer_period})"
        )
    if (
        d.get("mamba_inner_layernorms", True) is not True
    ):  # an early config key; transformers 5 always has them
        raise ModelConfigError(
            "mamba_inner_layernorms must be true: JambaForCausalLM's Mamba layers "
            "normalise dt, B and C (dt_layernorm, b_layernorm, c_layernorm)"
        )
    return dict(
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        mamba=mamba,
        **_jamba_attention_and_moe(arch, d, common),
    )


def _jamba_attention_and_moe(
    arch: str, d: Mapping[str, Any], common: dict[str, Any]
) -> dict[str, Any]:
    # Jamba's attention layers: LlamaAttention's projections without RoPE or biases, head_dim
    # hidden_size // num_attention_heads unless the config names one; MoE by expert period.
    from turnout.engine.model.config import ModelConfigError
    from turnout.engine.model.moe_config import MoEConfig, jamba_num_experts

    heads = common["num_attention_heads"]
    kv_heads = d.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else _positive(d, "num_key_value_heads")
    if heads % kv_heads:
        raise ModelConfigError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    head_dim = (
        _positive(d, "head_dim")
        if d.get("head_dim") is not None
        else common["hidden_size"] // heads
    )
    if d.get("sliding_window") is not None:
        raise ModelConfigError(
            f"sliding_window={d['sliding_window']!r}: Jamba's attention layers attend to the whole "
            f"sequence (transformers' JambaAttention has no window); set it to null"
        )
    moe = None  # one expert: every feed-forward is a dense MLP (transformers' layers_num_experts)
    if jamba_num_experts(d) > 1:
        moe = MoEConfig.from_hf_dict(
            d, architecture=arch, num_hidden_layers=common["num_hidden_layers"]
        )
    return dict(num_key_value_heads=kv_heads, head_dim=head_dim, moe=moe)


__all__ = ["DEFAULT_MAX_MODEL_LEN", "MAMBA_ARCHITECTURES", "MambaConfig", "mamba_model_config"]
