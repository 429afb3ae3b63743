"""Rotary position embedding of q and k (Su et al. 2021, neox "rotate halves" layout as HF Llama
and Qwen), with Qwen3's per-head q/k RMSNorm before it, in one kernel over the QKV projection's
output, in place (vLLM's ``rotary_embedding`` custom op, csrc/pos_encoding_kernels.cu, and its
fused q/k norm + RoPE for Qwen3).

In torch the same work is a gather of the cos/sin tables, two casts, two chunks, four
multiplies, an add, a subtract and a concatenation for each of q and k (plus seven kernels per
norm): about thirty launches per layer, each a round trip through HBM.

Numerics follow HF: the norm as ``kernels/rms_norm.py``; the float32 tables are cast to the
model dtype, and ``x1 * cos - x2 * sin`` / ``x2 * cos + x1 * sin`` round after each multiply and
after the add, as torch's bf16 ops do.

Layout: ``qkv`` is ``[num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]`` (q heads, then k
heads, then v heads), unit last stride; heads ``0 .. num_heads + num_kv_heads - 1`` are rotated
(q, then k) and v is left alone.
"""

from __future__ import annotations

import torch

from kernels._checks import check_dtypes, check_flat, dtype_name
from kernels._triton import require_triton, tl, triton


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    qkv_stride,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    table_stride,
    q_weight_ptr,
    k_weight_ptr,
    num_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    # One program per (token, q-or-k head): the head's two halves in registers.
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    half = tl.arange(0, HEAD_DIM // 2)
    base = qkv_ptr + tok * qkv_stride + head.to(tl.int64) * HEAD_DIM
    x1 = tl.load(base + half)
    x2 = tl.load(base + HEAD_DIM // 2 + half)
    dtype = x1.dtype
    if HAS_NORM:
        h1, h2 = x1.to(tl.float32), x2.to(tl.float32)
        mean_sq = (tl.sum(h1 * h1, axis=0) + tl.sum(h2 * h2, axis=0)) / HEAD_DIM
        inv = tl.math.rsqrt(mean_sq + eps)
        is_q = head < num_heads
        w1 = tl.where(is_q, tl.load(q_weight_ptr + half), tl.load(k_weight_ptr + half))
        w2 = tl.where(is_q, tl.load(q_weight_ptr + HEAD_DIM // 2 + half),
                      tl.load(k_weight_ptr + HEAD_DIM // 2 + half))
        x1 = ((h1 * inv).to(dtype).to(tl.float32) * w1.to(tl.float32)).to(dtype)
        x2 = ((h2 * inv).to(dtype).to(tl.float32) * w2.to(tl.float32)).to(dtype)
    pos = tl.load(positions_ptr + tok)
    cos = tl.load(cos_ptr + pos * table_stride + half).to(dtype).to(tl.float32)
    sin = tl.load(sin_ptr + pos * table_stride + half).to(dtype).to(tl.float32)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    out1 = ((a1 * cos).to(dtype).to(tl.float32) - (a2 * sin).to(dtype).to(tl.float32)).to(dtype)
    out2 = ((a2 * cos).to(dtype).to(tl.float32) + (a1 * sin).to(dtype).to(tl.float32)).to(dtype)
    tl.store(base + half, out1)
    tl.store(base + HEAD_DIM // 2 + half, out2)


def qk_norm_rope(
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], updated in place
    positions: torch.Tensor,  # [num_tokens] int64
    cos_cache: torch.Tensor,  # [max_positions, head_dim // 2] float32
    sin_cache: torch.Tensor,  # [max_positions, head_dim // 2] float32
    num_heads: int,
    num_kv_heads: int,
    q_weight: torch.Tensor | None = None,  # [head_dim] qkv's dtype: Qwen3's q_norm
    k_weight: torch.Tensor | None = None,  # [head_dim] qkv's dtype: Qwen3's k_norm
    eps: float = 1e-6,
) -> None:
    """Normalise (when weights are given) and rotate the q and k heads of ``qkv`` in place
    (Triton). Positions must lie in ``[0, max_positions)``: they index the tables unchecked,
    as the torch path's gather would fault.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations (named), or
            head_dim is not a power of two.
    """
    require_triton()
    head_dim = _check(qkv, positions, cos_cache, sin_cache, num_heads, num_kv_heads, q_weight, k_weight)
    if qkv.shape[0] == 0:
        return
    has_norm = q_weight is not None
    _qk_norm_rope_kernel[(qkv.shape[0], num_heads + num_kv_heads)](
        qkv, qkv.stride(0), positions, cos_cache, sin_cache, cos_cache.stride(0),
        q_weight if has_norm else qkv, k_weight if has_norm else qkv, num_heads, eps,
        HEAD_DIM=head_dim, HAS_NORM=has_norm, num_warps=1 if head_dim <= 128 else 2,
    )


def qk_norm_rope_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """Torch reference of :func:`qk_norm_rope` (HF's ``q_norm``/``k_norm`` then
    ``apply_rotary_pos_emb``), in place."""
    head_dim = _check(qkv, positions, cos_cache, sin_cache, num_heads, num_kv_heads, q_weight, k_weight)
    num_tokens = qkv.shape[0]
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    cos = cos_cache[positions].unsqueeze(1).to(qkv.dtype)
    sin = sin_cache[positions].unsqueeze(1).to(qkv.dtype)
    for part, weight in ((q, q_weight), (k, k_weight)):
        x = part
        if weight is not None:
            h = x.float()
            x = weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        part.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))


def _check(qkv: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
           num_heads: int, num_kv_heads: int, q_weight: torch.Tensor | None,
           k_weight: torch.Tensor | None) -> int:
    if qkv.dim() != 2 or (qkv.shape[1] and qkv.stride(1) != 1):
        raise ValueError(f"qkv must be [num_tokens, width] with unit last stride, got shape "
                         f"{tuple(qkv.shape)}, strides {qkv.stride()}")
    head_dim = 2 * cos_cache.shape[-1] if cos_cache.dim() == 2 else 0
    if head_dim == 0 or head_dim & (head_dim - 1) or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv width {qkv.shape[1]} must be (num_heads + 2 * num_kv_heads) * head_dim "
                         f"with head_dim = 2 * cos_cache.shape[1] a power of two, got head_dim {head_dim}")
    check_dtypes(positions=(positions, torch.int64), cos_cache=(cos_cache, torch.float32),
                 sin_cache=(sin_cache, torch.float32))
    check_flat(positions=positions)
    if positions.shape[0] != qkv.shape[0]:
        raise ValueError(f"positions must have one entry per token ({qkv.shape[0]}), got {positions.shape[0]}")
    if sin_cache.shape != cos_cache.shape or cos_cache.stride() != sin_cache.stride() or cos_cache.stride(-1) != 1:
        raise ValueError("cos_cache and sin_cache must have the same shape and strides, unit last stride")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("give both q_weight and k_weight, or neither")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w is not None and (w.shape != (head_dim,) or w.dtype != qkv.dtype or w.stride(0) != 1):
            raise ValueError(f"{name} must be [{head_dim}] {dtype_name(qkv.dtype)} contiguous, got "
                             f"{list(w.shape)} {dtype_name(w.dtype)}")
    return head_dim


__all__ = ["qk_norm_rope", "qk_norm_rope_ref"]
