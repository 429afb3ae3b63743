"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1), over a paged latent cache.

Parameter names are HF's (transformers ``DeepseekV2Attention``): ``q_proj`` or the LoRA'd
``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``; ``kv_a_proj_with_mqa`` -> ``[c_kv, k_pe]``;
``kv_a_layernorm`` on ``c_kv``; ``kv_b_proj`` (``[H * (qk_nope + v), kv_lora_rank]``: per head,
``W_UK`` rows then ``W_UV`` rows); ``o_proj``.

The cache holds ``[c_kv, k_pe]`` per token (``kv_lora_rank + qk_rope_head_dim`` values), and
attention runs in the latent space for every token, decode and prefill: ``W_UK`` is absorbed
into the query (``q_nope @ W_UK``, per head) and ``W_UV`` applied to the latent output, as
vLLM's MLA backends do for decode. The keys and values are never expanded per head, so each
step reads the cache once.
"""

from __future__ import annotations

import torch
from torch import nn

from turnout.engine.model.attention import mla_attention_forward
from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.config import ModelConfig
from turnout.engine.model.deepseek_rope import DeepseekRotaryEmbedding
from turnout.engine.model.deepseek_v2_config import MLAConfig
from turnout.engine.model.layers import RMSNorm


def mla_of(config: ModelConfig) -> MLAConfig:
    """``config.mla``, or a ValueError for a config without latent attention."""
    if config.mla is None:
        raise ValueError(f"{config.architecture} has no multi-head latent attention config")
    return config.mla


class MLAAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        mla = mla_of(config)
        self.num_heads, self.backend = config.num_attention_heads, backend
        self.kv_lora_rank, self.rope_dim = mla.kv_lora_rank, mla.qk_rope_head_dim
        self.nope_dim, self.v_dim = mla.qk_nope_head_dim, mla.v_head_dim
        self.scale = mla.softmax_scale
        h, bias, q_width = (
            config.hidden_size,
            config.attention_bias,
            self.num_heads * mla.qk_head_dim,
        )
        self.q_lora_rank = mla.q_lora_rank
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(h, q_width, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, mla.q_lora_rank, bias=bias)
            # transformers' DeepseekV2RMSNorm default eps (the config's rms_norm_eps is not passed)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, mla.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(
            mla.kv_lora_rank, self.num_heads * (self.nope_dim + self.v_dim), bias=False
        )
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, bias=bias)

    def _query(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, H, qk_nope + qk_rope]
        q: torch.Tensor
        if self.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        return q.view(hidden.shape[0], self.num_heads, self.nope_dim + self.rope_dim)

    def _up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        # kv_b_proj.weight [H * (nope + v), rank] -> W_UK [H, nope, rank], W_UV^T [H, rank, v]
        w = self.kv_b_proj.weight.view(
            self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank
        )
        return w[:, : self.nope_dim], w[:, self.nope_dim :].transpose(1, 2)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        rotary: DeepseekRotaryEmbedding,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size]
        num_tokens = hidden.shape[0]
        q_nope, q_pe = torch.split(self._query(hidden), [self.nope_dim, self.rope_dim], dim=-1)
        kv_c, k_pe = self.kv_a_proj_with_mqa(hidden).split(
            [self.kv_lora_rank, self.rope_dim], dim=-1
        )
        kv_c = self.kv_a_layernorm(kv_c)
        q_pe, k_pe = rotary(positions, q_pe, k_pe)
        w_uk, w_uv_t = self._up_projections()
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk)  # [H, T, rank]
        query = torch.cat([q_latent.transpose(0, 1), q_pe], dim=-1)  # [T, H, rank + rope]
        out_latent = mla_attention_forward(
            query, kv_c, k_pe, kv_cache, attn_metadata, scale=self.scale, backend=self.backend
        )
        out = torch.bmm(out_latent.transpose(0, 1), w_uv_t)  # [H, T, v]
        projected: torch.Tensor = self.o_proj(
            out.transpose(0, 1).reshape(num_tokens, self.num_heads * self.v_dim)
        )
        return projected
