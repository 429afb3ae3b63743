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

from turnout.kernels._checks import check_dtypes, check_flat, dtype_name
from turnout.kernels._triton import require_triton, tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _qk_norm_rope_kernel(  # type: ignore[no-untyped-def]
    qkv_ptr,
    qkv_stride,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    table_stride,
    q_weight_ptr,
    k_weight_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    cache_stride_slot,  # elements from one slot to the next (num_kv_heads * head_dim)
    num_heads,
    num_kv_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    HEADS_P: tl.constexpr,  # next power of two of num_heads + num_kv_heads
    KV_HEADS_P: tl.constexpr,  # next power of two of num_kv_heads
    HAS_NORM: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
):
    # One program per token: every q and k head as rows of a [HEADS_P, HEAD_DIM // 2] tile
    # (the two halves in registers), then k and v to the token's KV-cache slot.
    tok = tl.program_id(0).to(tl.int64)
    head = tl.arange(0, HEADS_P)
    half = tl.arange(0, HEAD_DIM // 2)
    head_mask = (head < num_heads + num_kv_heads)[:, None]
    row = qkv_ptr + tok * qkv_stride
    offs = head[:, None] * HEAD_DIM + half[None, :]
    x1 = tl.load(row + offs, mask=head_mask, other=0.0)
    x2 = tl.load(row + HEAD_DIM // 2 + offs, mask=head_mask, other=0.0)
    dtype = x1.dtype
    if HAS_NORM:
        h1, h2 = x1.to(tl.float32), x2.to(tl.float32)
        mean_sq = (tl.sum(h1 * h1, axis=1) + tl.sum(h2 * h2, axis=1)) / HEAD_DIM
        inv = tl.math.rsqrt(mean_sq + eps)[:, None]
        is_q = (head < num_heads)[:, None]
        w1 = tl.where(
            is_q, tl.load(q_weight_ptr + half)[None, :], tl.load(k_weight_ptr + half)[None, :]
        )
        w2 = tl.where(
            is_q,
            tl.load(q_weight_ptr + HEAD_DIM // 2 + half)[None, :],
            tl.load(k_weight_ptr + HEAD_DIM // 2 + half)[None, :],
        )
        x1 = ((h1 * inv).to(dtype).to(tl.float32) * w1.to(tl.float32)).to(dtype)
        x2 = ((h2 * inv).to(dtype).to(tl.float32) * w2.to(tl.float32)).to(dtype)
    pos = tl.load(positions_ptr + tok)
    cos = tl.load(cos_ptr + pos * table_stride + half).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * table_stride + half).to(dtype).to(tl.float32)[None, :]
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    out1 = ((a1 * cos).to(dtype).to(tl.float32) - (a2 * sin).to(dtype).to(tl.float32)).to(dtype)
    out2 = ((a2 * cos).to(dtype).to(tl.float32) + (a1 * sin).to(dtype).to(tl.float32)).to(dtype)
    tl.store(row + offs, out1, mask=head_mask)
    tl.store(row + HEAD_DIM // 2 + offs, out2, mask=head_mask)
    if WRITE_CACHE:
        slot = tl.load(slot_mapping_ptr + tok)
        if slot >= 0:  # -1: a padding token writes nothing
            base = (
                slot * cache_stride_slot - num_heads * HEAD_DIM
            )  # row `head` of k at kv head head - num_heads
            k_mask = head_mask & (head >= num_heads)[:, None]
            tl.store(key_cache_ptr + base + offs, out1, mask=k_mask)
            tl.store(key_cache_ptr + base + HEAD_DIM // 2 + offs, out2, mask=k_mask)
            kv_head = tl.arange(0, KV_HEADS_P)
            dim = tl.arange(0, HEAD_DIM)
            v_offs = kv_head[:, None] * HEAD_DIM + dim[None, :]
            v_mask = (kv_head < num_kv_heads)[:, None]
            v = tl.load(row + (num_heads + num_kv_heads) * HEAD_DIM + v_offs, mask=v_mask)
            tl.store(value_cache_ptr + slot * cache_stride_slot + v_offs, v, mask=v_mask)


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
    kv_cache: torch.Tensor
    | None = None,  # [2, num_blocks, block_size, num_kv_heads, head_dim], written
    slot_mapping: torch.Tensor | None = None,  # [num_tokens] int64, -1 = write nothing
) -> None:
    """Normalise (when weights are given) and rotate the q and k heads of ``qkv`` in place
    (Triton); with ``kv_cache`` and ``slot_mapping``, also write each token's rotated k and its
    v to its slot, as ``kernels.paged_attention.reshape_and_cache`` would (vLLM fuses the same
    write into its RoPE for the same reason: one pass over k instead of two). Positions must lie
    in ``[0, max_positions)``: they index the tables unchecked, as the torch path's gather would
    fault.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations (named), a head
            count is not an int >= 1, or head_dim is not a power of two.
    """
    require_triton()
    head_dim = _check(
        qkv, positions, cos_cache, sin_cache, num_heads, num_kv_heads, q_weight, k_weight
    )
    write_cache = _check_cache(kv_cache, slot_mapping, qkv, num_kv_heads, head_dim)
    if qkv.shape[0] == 0:
        return
    has_norm = q_weight is not None
    key_cache, value_cache = (kv_cache[0], kv_cache[1]) if kv_cache is not None else (qkv, qkv)
    heads_p = triton.next_power_of_2(num_heads + num_kv_heads)
    _qk_norm_rope_kernel[(qkv.shape[0],)](
        qkv,
        qkv.stride(0),
        positions,
        cos_cache,
        sin_cache,
        cos_cache.stride(0),
        q_weight if has_norm else qkv,
        k_weight if has_norm else qkv,
        key_cache,
        value_cache,
        slot_mapping if write_cache else positions,
        num_kv_heads * head_dim,
        num_heads,
        num_kv_heads,
        eps,
        HEAD_DIM=head_dim,
        HEADS_P=heads_p,
        KV_HEADS_P=triton.next_power_of_2(num_kv_heads),
        HAS_NORM=has_norm,
        WRITE_CACHE=write_cache,
        num_warps=max(1, min(8, heads_p * head_dim // 1024)),
    )


def _check_cache(
    kv_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor | None,
    qkv: torch.Tensor,
    num_kv_heads: int,
    head_dim: int,
) -> bool:
    if (kv_cache is None) != (slot_mapping is None):
        raise ValueError("give both kv_cache and slot_mapping, or neither")
    if kv_cache is None or slot_mapping is None:
        return False
    if (
        kv_cache.dim() != 5
        or kv_cache.shape[0] != 2
        or tuple(kv_cache.shape[3:]) != (num_kv_heads, head_dim)
        or not kv_cache.is_contiguous()
        or kv_cache.dtype != qkv.dtype
    ):
        raise ValueError(
            f"kv_cache must be a contiguous [2, num_blocks, block_size, {num_kv_heads}, {head_dim}] "
            f"{dtype_name(qkv.dtype)} tensor, got {list(kv_cache.shape)} {dtype_name(kv_cache.dtype)}"
        )
    check_dtypes(slot_mapping=(slot_mapping, torch.int64))
    check_flat(slot_mapping=slot_mapping)
    if slot_mapping.shape[0] != qkv.shape[0]:
        raise ValueError(
            f"slot_mapping must have one entry per token ({qkv.shape[0]}), got {slot_mapping.shape[0]}"
        )
    return True


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
    kv_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> None:
    """Torch reference of :func:`qk_norm_rope` (HF's ``q_norm``/``k_norm`` then
    ``apply_rotary_pos_emb``, then ``reshape_and_cache_ref`` when a cache is given), in place."""
    head_dim = _check(
        qkv, positions, cos_cache, sin_cache, num_heads, num_kv_heads, q_weight, k_weight
    )
    write_cache = _check_cache(kv_cache, slot_mapping, qkv, num_kv_heads, head_dim)
    num_tokens = qkv.shape[0]
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim
    )
    cos = cos_cache[positions].unsqueeze(1).to(qkv.dtype)
    sin = sin_cache[positions].unsqueeze(1).to(qkv.dtype)
    for part, weight in ((q, q_weight), (k, k_weight)):
        x = part
        if weight is not None:
            h = x.float()
            x = weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        part.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    if write_cache:
        assert kv_cache is not None and slot_mapping is not None
        v = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
        valid = slot_mapping >= 0
        kv_cache[0].view(-1, num_kv_heads, head_dim)[slot_mapping[valid]] = k[valid]
        kv_cache[1].view(-1, num_kv_heads, head_dim)[slot_mapping[valid]] = v[valid]


def _check(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
) -> int:
    counts = (num_heads, num_kv_heads)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
        # a width can match by accident ((-4 + 2 * 6) * d == (4 + 2 * 2) * d)
        raise ValueError(
            f"num_heads and num_kv_heads must be ints >= 1, got {num_heads!r} and {num_kv_heads!r}"
        )
    if qkv.dim() != 2 or (qkv.shape[1] and qkv.stride(1) != 1):
        raise ValueError(
            f"qkv must be [num_tokens, width] with unit last stride, got shape "
            f"{tuple(qkv.shape)}, strides {qkv.stride()}"
        )
    head_dim = 2 * cos_cache.shape[-1] if cos_cache.dim() == 2 else 0
    if (
        head_dim == 0
        or head_dim & (head_dim - 1)
        or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim
    ):
        raise ValueError(
            f"qkv width {qkv.shape[1]} must be (num_heads + 2 * num_kv_heads) * head_dim "
            f"with head_dim = 2 * cos_cache.shape[1] a power of two, got head_dim {head_dim}"
        )
    check_dtypes(
        positions=(positions, torch.int64),
        cos_cache=(cos_cache, torch.float32),
        sin_cache=(sin_cache, torch.float32),
    )
    check_flat(positions=positions)
    if positions.shape[0] != qkv.shape[0]:
        raise ValueError(
            f"positions must have one entry per token ({qkv.shape[0]}), got {positions.shape[0]}"
        )
    if (
        sin_cache.shape != cos_cache.shape
        or cos_cache.stride() != sin_cache.stride()
        or cos_cache.stride(-1) != 1
    ):
        raise ValueError(
            "cos_cache and sin_cache must have the same shape and strides, unit last stride"
        )
    if (q_weight is None) != (k_weight is None):
        raise ValueError("give both q_weight and k_weight, or neither")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w is not None and (w.shape != (head_dim,) or w.dtype != qkv.dtype or w.stride(0) != 1):
            raise ValueError(
                f"{name} must be [{head_dim}] {dtype_name(qkv.dtype)} contiguous, got "
                f"{list(w.shape)} {dtype_name(w.dtype)}"
            )
    return head_dim


__all__ = ["qk_norm_rope", "qk_norm_rope_ref"]
