"""Building blocks of the decoders: RMSNorm, rotary position embedding, the SiLU-gated MLP.

Plain PyTorch; numerics follow HF transformers' Llama implementation (normalisation in float32,
RoPE tables computed in float32) so that fp32 logits agree to rounding. On CUDA tensors the
RMSNorm (with the residual add before it) and the gated MLP's SiLU·mul run as one Triton kernel
each (``kernels/rms_norm.py``, ``kernels/silu_mul.py``) instead of a chain of elementwise
kernels; :func:`set_fused_layer_ops` turns that off (benchmarks compare both).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from turnout.engine.model.config import ModelConfig, RopeScaling

_fused_layer_ops = True


def set_fused_layer_ops(enabled: bool) -> bool:
    """Run RMSNorm and SiLU·mul of CUDA tensors through the fused Triton kernels (the default)
    or through torch; returns the previous setting. CPU tensors always take the torch path."""
    global _fused_layer_ops
    previous, _fused_layer_ops = _fused_layer_ops, bool(enabled)
    return previous


def _fused(x: torch.Tensor) -> bool:
    if not (_fused_layer_ops and x.is_cuda):
        return False
    from turnout.kernels._triton import HAS_TRITON

    return HAS_TRITON


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), over the last dimension.

    ``x * rsqrt(mean(x**2) + eps) * weight``, computed in float32 and cast back to ``x``'s
    dtype before the weight multiply (HF ``LlamaRMSNorm``).
    """

    def __init__(self, hidden_size: int, eps: float, *, fused: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps
        self.fused = fused  # False: always torch's ops (a model whose parity is bit-for-bit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> same
        if self.fused and _fused(x) and x.dim() in (2, 3) and x.stride(-1) == 1:
            from turnout.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(
        self,
        x: torch.Tensor,  # [T, hidden], a residual branch's output
        residual: torch.Tensor,  # [T, hidden], the residual stream
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (RMSNorm(x + residual), x + residual)
        """HF's ``residual = residual + x; out = norm(residual)`` (the sum rounded to the
        model dtype). On CUDA one kernel does both and the returned sum is ``residual``,
        updated in place; on the CPU it is a new tensor."""
        if self.fused and _fused(x) and x.stride(-1) == 1 and residual.stride(-1) == 1:
            from turnout.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual=residual), residual
        summed = residual + x
        return self(summed), summed


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2] float32`` of RoPE (Su et al. 2021), with scaling.

    ``llama3``: wavelengths longer than ``original_max_position_embeddings / low_freq_factor``
    are divided by ``factor``, shorter than ``... / high_freq_factor`` kept, and the band in
    between interpolated linearly in ``original / wavelength`` (meta-llama/llama-models
    ``apply_scaling``; vLLM PR #6553).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_band, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE (rotate halves, as HF Llama/Qwen) from a cos/sin table by position.

    The table ``[max_position_embeddings, head_dim // 2] float32`` is a non-persistent buffer,
    built by :meth:`build_cache` (called on construction and again after a meta-device load).
    """

    cos_cache: torch.Tensor
    sin_cache: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.theta = config.rope_theta
        self.scaling = config.rope_scaling
        self.max_positions = config.max_position_embeddings
        self.register_buffer("cos_cache", torch.empty(0), persistent=False)
        self.register_buffer("sin_cache", torch.empty(0), persistent=False)
        if self.cos_cache.device.type != "meta":  # under a meta context the loader builds it
            self.build_cache(self.cos_cache.device)

    def build_cache(self, device: torch.device | str) -> None:
        """(Re)compute the cos/sin tables on ``device`` (float32)."""
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling)
        positions = torch.arange(self.max_positions, dtype=torch.int64, device="cpu").float()
        freqs = torch.outer(positions, inv_freq)
        self.cos_cache = freqs.cos().to(device)
        self.sin_cache = freqs.sin().to(device)

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos_cache[positions].unsqueeze(1)  # [T, 1, head_dim // 2] float32
        sin = self.sin_cache[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def forward_qkv(
        self,
        positions: torch.Tensor,  # [T] int64
        qkv: torch.Tensor,  # [T, (num_heads + 2 * num_kv_heads) * head_dim], the fused projection
        num_heads: int,
        num_kv_heads: int,
        q_norm: RMSNorm | None = None,  # Qwen3's per-head norms, applied before the rotation
        k_norm: RMSNorm | None = None,
        kv_cache: torch.Tensor | None = None,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        slot_mapping: torch.Tensor | None = None,  # [T] int64, -1 = padding
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """Split the QKV output into heads, normalise q and k (when norms are given) and rotate
        them: ``(q [T, H, D], k [T, KVH, D], v [T, KVH, D], kv_written)``. On CUDA one kernel
        does norms and rotation in place in ``qkv`` and, given ``kv_cache`` and
        ``slot_mapping``, writes k and v to their slots too (``kv_written`` is then True and
        attention must not write them again); elsewhere the torch ops of :meth:`forward`."""
        num_tokens, d = qkv.shape[0], self.head_dim
        if _fused(qkv) and qkv.stride(-1) == 1 and d & (d - 1) == 0:
            from turnout.kernels.rotary import qk_norm_rope

            weights: tuple[torch.Tensor | None, torch.Tensor | None] = (
                (q_norm.weight, k_norm.weight)
                if q_norm is not None and k_norm is not None
                else (None, None)
            )
            eps = q_norm.eps if q_norm is not None else 1e-6
            write = kv_cache is not None and slot_mapping is not None and kv_cache.numel() > 0
            qk_norm_rope(
                qkv,
                positions,
                self.cos_cache,
                self.sin_cache,
                num_heads,
                num_kv_heads,
                *weights,
                eps=eps,
                kv_cache=kv_cache if write else None,
                slot_mapping=slot_mapping if write else None,
            )
            q, k, v = torch.split(qkv, [num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
            return (
                q.view(num_tokens, num_heads, d),
                k.view(num_tokens, num_kv_heads, d),
                v.view(num_tokens, num_kv_heads, d),
                write,
            )
        q, k, v = torch.split(qkv, [num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
        q, k = q.view(num_tokens, num_heads, d), k.view(num_tokens, num_kv_heads, d)
        if q_norm is not None and k_norm is not None:
            q, k = q_norm(q), k_norm(k)
        q, k = self(positions, q, k)
        return q, k, v.view(num_tokens, num_kv_heads, d), False


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # HF casts the tables to x's dtype and rotates in that dtype; so do we.
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused in one projection (a decoder's
    dense MLP, and the shared expert of an MoE block)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        gate_up = self.gate_up_proj(x)
        if _fused(gate_up) and gate_up.dim() == 2:
            from turnout.kernels.silu_mul import silu_and_mul

            fused_out: torch.Tensor = self.down_proj(silu_and_mul(gate_up))
            return fused_out
        gate, up = gate_up.chunk(2, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out
