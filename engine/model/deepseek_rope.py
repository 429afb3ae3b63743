"""DeepSeek-V2's rotary embedding: YaRN-scaled frequencies, rotating interleaved pairs.

RoPE applies only to the rotary part of each head (``qk_rope_head_dim``: ``q_pe`` per head and
the shared ``k_pe``). DeepSeek rotates *adjacent* pairs ``(x[2i], x[2i+1])`` by frequency ``i``
(GPT-J style; transformers' ``apply_rotary_emb`` views them as complex numbers, vLLM calls it
``is_neox_style=False``), in float32, with the cos/sin tables multiplied by YaRN's
``attention_factor``; the result is cast back to the input's dtype. DeepSeek's original code
rotates the same pairs after permuting them to halves; scores are unchanged, and so is what this
layer caches (both rotated keys and queries keep the interleaved order).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from turnout.engine.model.deepseek_v2_config import YarnScaling


def yarn_inv_freq(dim: int, theta: float, yarn: YarnScaling | None) -> torch.Tensor:
    """Inverse frequencies ``[dim // 2] float32``: plain RoPE (Su et al. 2021) without
    ``yarn``, else YaRN's blend (arXiv:2309.00071 §3.2) of interpolated (``/ factor``) and
    original frequencies with a linear ramp over the correction range of
    ``beta_fast``/``beta_slow`` rotations (transformers ``_compute_yarn_parameters``)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)
    extrapolation = 1.0 / pos_freqs
    if yarn is None:
        return extrapolation
    interpolation = 1.0 / (yarn.factor * pos_freqs)
    low, high = _correction_range(yarn, dim, theta)
    if low == high:
        high += 0.001  # as transformers: avoid a division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: original frequency (high-frequency dims), 0: interpolated
    return interpolation * (1 - keep) + extrapolation * keep


def _correction_range(yarn: YarnScaling, dim: int, theta: float) -> tuple[float, float]:
    def dim_of(num_rotations: float) -> float:
        return (
            dim
            * math.log(yarn.original_max_position_embeddings / (num_rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = dim_of(yarn.beta_fast), dim_of(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


class DeepseekRotaryEmbedding(nn.Module):
    """Interleaved-pair RoPE over ``qk_rope_head_dim`` from a cos/sin table by position.

    The tables ``[max_position_embeddings, rope_dim // 2] float32`` (already multiplied by
    YaRN's ``attention_factor``) are non-persistent buffers built by :meth:`build_cache`
    (on construction, and again after a meta-device load).
    """

    cos_cache: torch.Tensor
    sin_cache: torch.Tensor

    def __init__(
        self, rope_dim: int, theta: float, yarn: YarnScaling | None, max_positions: int
    ) -> None:
        super().__init__()
        self.rope_dim, self.theta, self.yarn, self.max_positions = (
            rope_dim,
            theta,
            yarn,
            max_positions,
        )
        self.register_buffer("cos_cache", torch.empty(0), persistent=False)
        self.register_buffer("sin_cache", torch.empty(0), persistent=False)
        if self.cos_cache.device.type != "meta":  # under a meta context the loader builds it
            self.build_cache(self.cos_cache.device)

    def build_cache(self, device: torch.device | str) -> None:
        """(Re)compute the cos/sin tables on ``device`` (float32)."""
        inv_freq = yarn_inv_freq(self.rope_dim, self.theta, self.yarn)
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.int64).float(), inv_freq)
        scale = self.yarn.cos_sin_scale if self.yarn is not None else 1.0
        self.cos_cache = (freqs.cos() * scale).to(device)
        self.sin_cache = (freqs.sin() * scale).to(device)

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        q_pe: torch.Tensor,  # [T, num_heads, rope_dim]
        k_pe: torch.Tensor,  # [T, rope_dim], shared by every head
    ) -> tuple[torch.Tensor, torch.Tensor]:  # same shapes and dtypes, rotated
        cos = self.cos_cache[positions]  # [T, rope_dim // 2] float32
        sin = self.sin_cache[positions]
        return (_rotate_pairs(q_pe, cos[:, None], sin[:, None]), _rotate_pairs(k_pe, cos, sin))


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # (x0 + i x1) * (cos + i sin), in float32 as transformers' complex product.
    pairs = torch.unflatten(x.float(), -1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)
