"""Jamba (``JambaForCausalLM``; Lieber et al. 2024, arXiv:2403.19887): a hybrid of attention
and Mamba-1 layers, each followed by a dense MLP or a mixture of experts, over packed tokens.

Layer ``i`` is an attention layer when ``i % attn_layer_period == attn_layer_offset`` and a
Mamba layer otherwise; its feed-forward is a :class:`~engine.model.moe.SparseMoeBlock` when
``i % expert_layer_period == expert_layer_offset`` (and the config has more than one expert),
a :class:`~engine.model.layers.GatedMLP` otherwise. Every layer is::

    h = h + mixer(input_layernorm(h))          # attention or Mamba
    h = h + feed_forward(pre_ff_layernorm(h))

The math matched is transformers 5.24 ``models/jamba/modeling_jamba.py``: attention without
positional encoding (no RoPE: the Mamba layers carry position), softmax scale
``head_dim ** -0.5``, no biases; the Mamba mixer is :class:`~engine.model.mamba.MambaMixer`
with Jamba's RMSNorms on dt, B and C (``MambaConfig.inner_layernorms``); the router
(``JambaTopKRouter``) takes the top-k of the softmax, not renormalised
(``engine.model.moe_config``); the residual stream stays in the model dtype.

Caches (``engine.model.state_cache``): ``kv_caches`` holds one entry per layer, in layer
order: the paged ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensor of an
attention layer, the :class:`~engine.model.state_cache.MambaState` slots of a Mamba layer.
KV blocks are sized by the attention layers alone; the state takes ``max_num_seqs`` slots.

Parameter names are HF's (``model.embed_tokens``, ``model.layers.{i}.self_attn.*`` /
``.mamba.*``, ``.feed_forward.*``, ``model.final_layernorm``, ``lm_head``) except the fused
``self_attn.qkv_proj`` and ``feed_forward.gate_up_proj`` (``engine.model.llama.FUSED_PARAMS``)
and the stacked experts (``engine.model.moe_weights``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from turnout.engine.model.attention import paged_attention_forward
from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.config import ModelConfig
from turnout.engine.model.kv_cache import FullAttentionSpec
from turnout.engine.model.layers import GatedMLP, RMSNorm
from turnout.engine.model.llama import FUSED_PARAMS, DecoderModel
from turnout.engine.model.mamba import MambaMixer, mixer_weight_shapes
from turnout.engine.model.moe import SparseMoeBlock
from turnout.engine.model.moe_weights import moe_weight_shapes
from turnout.engine.model.state_cache import HybridCacheSpec, MambaState, MambaStepInputs


class JambaAttention(nn.Module):
    """Multi-head attention with grouped kv heads and no positional encoding (HF
    ``JambaAttention``) over the paged KV cache."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.backend = config.head_dim, backend
        self.q_size, self.kv_size = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)

    def forward(
        self, hidden: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:  # [T, H] -> [T, H]
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = paged_attention_forward(
            q.view(num_tokens, self.num_heads, self.head_dim),
            k.view(num_tokens, self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
            kv_cache,
            attn_metadata,
            scale=self.scale,
            backend=self.backend,
        )
        projected: torch.Tensor = self.o_proj(out.view(num_tokens, self.q_size))
        return projected


def _feed_forward(config: ModelConfig, layer: int, backend: str) -> GatedMLP | SparseMoeBlock:
    if config.moe is not None and config.moe.is_moe_layer(layer):
        return SparseMoeBlock(config.hidden_size, config.moe, backend)
    return GatedMLP(config.hidden_size, config.intermediate_size)


class JambaDecoderLayer(nn.Module):
    """One layer: an attention (``self_attn``) or Mamba (``mamba``) mixer, then the
    feed-forward, each behind its RMSNorm and residual (HF ``JambaAttentionDecoderLayer`` /
    ``JambaMambaDecoderLayer``)."""

    def __init__(self, config: ModelConfig, layer: int, backend: str) -> None:
        super().__init__()
        assert config.mamba is not None
        self.is_attention = config.mamba.is_attention_layer(layer)
        if self.is_attention:
            self.self_attn = JambaAttention(config, backend)
        else:
            self.mamba = MambaMixer(config.hidden_size, config.mamba, config.rms_norm_eps, backend)
        self.feed_forward = _feed_forward(config, layer, backend)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        cache: torch.Tensor | MambaState,
        attn_metadata: AttentionMetadata,
        step: MambaStepInputs | None,
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        if self.is_attention:
            assert isinstance(cache, torch.Tensor)
            mixed = self.self_attn(normed, cache, attn_metadata)
        else:
            assert isinstance(cache, MambaState) and step is not None
            mixed = self.mamba(normed, cache, step)
        hidden = hidden + mixed
        ff: torch.Tensor = self.feed_forward(self.pre_ff_layernorm(hidden))
        return hidden + ff


class JambaBody(nn.Module):
    """HF's ``model.`` prefix: embeddings, layers, final norm (``final_layernorm``)."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            JambaDecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)
        )
        self.final_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class JambaForCausalLM(DecoderModel):
    """The Jamba hybrid over paged KV caches and per-request Mamba state (see the module
    docstring).

    ``forward`` takes the arguments of every decoder; ``attn_metadata.state_indices`` gives
    each request's state slot. A request whose first token this step is at position 0 (new,
    or recomputed after preemption) starts its Mamba layers from zero state.
    """

    fused_params: ClassVar[dict[str, tuple[str, ...]]] = FUSED_PARAMS

    def __init__(self, config: ModelConfig, attn_backend: str = "auto") -> None:
        if config.mamba is None:
            raise ValueError(f"{config.architecture} has no Mamba config")
        super().__init__(config, attn_backend)

    @classmethod
    def build_body(cls, config: ModelConfig, attn_backend: str) -> nn.Module:
        return JambaBody(config, attn_backend)

    @classmethod
    def hf_weight_shapes(cls, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        m, h, i = config.mamba, config.hidden_size, config.intermediate_size
        assert m is not None
        q, kv = (
            config.num_attention_heads * config.head_dim,
            config.num_key_value_heads * config.head_dim,
        )
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (config.vocab_size, h),
            "model.final_layernorm.weight": (h,),
        }
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (config.vocab_size, h)
        for n in range(config.num_hidden_layers):
            p = f"model.layers.{n}."
            layer: dict[str, tuple[int, ...]] = {
                "input_layernorm.weight": (h,),
                "pre_ff_layernorm.weight": (h,),
            }
            if m.is_attention_layer(n):
                layer |= {
                    "self_attn.q_proj.weight": (q, h),
                    "self_attn.k_proj.weight": (kv, h),
                    "self_attn.v_proj.weight": (kv, h),
                    "self_attn.o_proj.weight": (h, q),
                }
            else:
                layer |= {f"mamba.{k}": s for k, s in mixer_weight_shapes(h, m).items()}
            if config.moe is None or not config.moe.is_moe_layer(n):  # a dense MLP
                layer |= {
                    "feed_forward.gate_proj.weight": (i, h),
                    "feed_forward.up_proj.weight": (i, h),
                    "feed_forward.down_proj.weight": (h, i),
                }
            shapes |= {p + k: s for k, s in layer.items()}
        return shapes | moe_weight_shapes(config)

    @classmethod
    def kv_cache_spec_for(cls, config: ModelConfig) -> HybridCacheSpec:
        m = config.mamba
        assert m is not None
        kinds = m.layer_kinds(config.num_hidden_layers)
        attention = FullAttentionSpec(
            num_layers=kinds.count("attention"),
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
        )
        return HybridCacheSpec(
            num_layers=config.num_hidden_layers,
            layer_kinds=kinds,
            attention=attention,
            d_inner=m.d_inner,
            d_conv=m.d_conv,
            d_state=m.d_state,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor | MambaState],  # type: ignore[override]
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size]
        """Run every layer over the step's packed tokens: attention layers read and write
        their paged caches, Mamba layers each request's state slot.

        Raises:
            ValueError: ``kv_caches`` is not one cache per layer of the layer's kind, or the
                metadata has no ``state_indices`` while the model has Mamba layers.
        """
        layers = self.model.layers
        self._check_caches(kv_caches)
        has_mamba = not all(layer.is_attention for layer in layers)
        step = MambaStepInputs.of(attn_metadata, positions) if has_mamba else None
        hidden = self.model.embed_tokens(input_ids)
        for layer, cache in zip(layers, kv_caches, strict=True):
            hidden = layer(hidden, cache, attn_metadata, step)
        out: torch.Tensor = self.model.final_layernorm(hidden)
        return out

    def _check_caches(self, kv_caches: list[torch.Tensor | MambaState]) -> None:
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"expected {len(layers)} caches (one per layer), got {len(kv_caches)}")
        for n, (layer, cache) in enumerate(zip(layers, kv_caches, strict=True)):
            want = torch.Tensor if layer.is_attention else MambaState
            if not isinstance(cache, want):
                raise ValueError(
                    f"layer {n} is {'an attention' if layer.is_attention else 'a Mamba'} layer: "
                    f"its cache must be a {want.__name__}, got {type(cache).__name__}"
                )


__all__ = ["JambaAttention", "JambaDecoderLayer", "JambaForCausalLM"]
