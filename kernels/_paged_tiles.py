"""Tiles shared by the paged-attention kernels (``kernels.paged_attention``, the unified
varlen kernel, and ``kernels.paged_attention_split``, split-KV decoding): the request lookup of
the flattened q-block grid, the key-tile ranges of a q tile (window edge, unmasked, diagonal),
the GQA-packed query tile and the online-softmax loop over key tiles, and the launch options.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnout.kernels._triton import tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _find_request(query_start_loc_ptr, q_block, num_reqs, BLOCK_Q: tl.constexpr):  # type: ignore[no-untyped-def]
    """The request owning global q block ``q_block``: the last ``i`` with
    ``query_start_loc[i] // BLOCK_Q + i <= q_block`` (strictly increasing in ``i``)."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit  # type: ignore[untyped-decorator]
def _key_tile_ranges(  # type: ignore[no-untyped-def]
    first_pos, last_pos, sliding_window, USE_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Key tiles ``[lo, mid_lo)`` (window edge, masked), ``[mid_lo, mid_hi)`` (seen whole by
    every query at positions ``first_pos..last_pos``) and ``[mid_hi, hi)`` (diagonal, masked)."""
    hi = (last_pos + BLOCK_N) // BLOCK_N
    mid_hi = (first_pos + 1) // BLOCK_N  # tiles ending at or before the first query
    if USE_WINDOW:  # keys older than every query's window are never read
        lo = tl.maximum(first_pos - sliding_window + 1, 0) // BLOCK_N
        mid_lo = tl.cdiv(tl.maximum(last_pos - sliding_window + 1, 0), BLOCK_N)
    else:
        lo = first_pos * 0
        mid_lo = lo
    return lo, mid_lo, tl.maximum(mid_hi, mid_lo), hi


@triton.jit  # type: ignore[untyped-decorator]
def _load_query_tile(  # type: ignore[no-untyped-def]
    q_ptr,
    q_start,
    first,
    q_len,
    kv_head,
    q_stride_t,
    q_stride_h,
    NUM_QUERIES_PER_KV: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Rows ``(query first + r // GROUP_P, head r % GROUP_P of the kv head's group)``."""
    rows = tl.arange(0, BLOCK_M)
    tok = first + rows // GROUP_P  # query index inside the request
    head = kv_head * NUM_QUERIES_PER_KV + rows % GROUP_P
    row_mask = (tok < q_len) & (rows % GROUP_P < NUM_QUERIES_PER_KV)
    dim = tl.arange(0, HEAD_DIM_P)
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * q_stride_t + head[:, None] * q_stride_h + dim[None, :],
        mask=row_mask[:, None] & (dim < HEAD_DIM)[None, :],
        other=0.0,
    )
    return q, tok, head, q_rows, row_mask


@triton.jit  # type: ignore[untyped-decorator]
def _zero_padding_rows(  # type: ignore[no-untyped-def]
    out_ptr,
    query_start_loc_ptr,
    num_reqs,
    num_tokens,
    kv_head,
    out_stride_t,
    out_stride_h,
    NUM_QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    """Zero rows ``query_start_loc[num_reqs]:num_tokens`` of ``out`` (a padded batch's extra
    rows, which no request owns) for the query heads of ``kv_head``."""
    total = tl.load(query_start_loc_ptr + num_reqs)
    dim = tl.arange(0, HEAD_DIM_P)
    zeros = tl.zeros([BLOCK_ROWS, HEAD_DIM_P], dtype=out_ptr.dtype.element_ty)
    for start in range(total, num_tokens, BLOCK_ROWS):
        rows = (start + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        mask = (rows < num_tokens)[:, None] & (dim < HEAD_DIM)[None, :]
        for h in tl.static_range(NUM_QUERIES_PER_KV):
            head = kv_head * NUM_QUERIES_PER_KV + h
            tl.store(
                out_ptr + rows[:, None] * out_stride_t + head * out_stride_h + dim[None, :],
                zeros,
                mask=mask,
            )


@triton.jit  # type: ignore[untyped-decorator]
def _attend_tiles(  # type: ignore[no-untyped-def]
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    bt_row,
    kv_head_off,
    tile_lo,
    tile_hi,
    kv_end,
    sliding_window,
    scale_log2,
    cache_stride_block,
    cache_stride_slot,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online-softmax update of ``(acc, m_i, l_i)`` over key tiles ``[tile_lo, tile_hi)``.
    ``MASKED`` applies ``key < kv_end``, causality and the window; unmasked tiles must lie
    wholly inside every row's allowed keys (a row's max is then finite after one tile)."""
    dim = tl.arange(0, HEAD_DIM_P)
    dim_mask = dim < HEAD_DIM
    for t in range(tile_lo, tile_hi):
        n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        if MASKED:
            n_mask = n < kv_end
            block = tl.load(bt_row + n // KV_BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            kv_mask = n_mask[:, None] & dim_mask[None, :]
        else:
            block = tl.load(bt_row + n // KV_BLOCK_SIZE).to(tl.int64)
            kv_mask = (n >= 0)[:, None] & dim_mask[None, :]
        off = (block * cache_stride_block + (n % KV_BLOCK_SIZE) * cache_stride_slot + kv_head_off)[
            :, None
        ] + dim[None, :]
        if MASKED or HEAD_DIM != HEAD_DIM_P:
            k = tl.load(k_cache_ptr + off, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + off, mask=kv_mask, other=0.0)
        else:
            k = tl.load(k_cache_ptr + off)
            v = tl.load(v_cache_ptr + off)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        if MASKED:
            allowed = (n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            if USE_WINDOW:
                allowed = allowed & (q_pos[:, None] - n[None, :] < sliding_window)
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@dataclass(frozen=True)
class AttentionTiles:
    """Tile and launch options of one attention launch. ``block_m`` rows are queries x the
    (power-of-two padded) query heads of one kv head; it is rounded to a multiple of that group
    and raised to 16 (the smallest tensor-core tile), so ``BLOCK_Q = block_m // group``.

    Raises:
        ValueError: ``block_m`` or ``num_warps`` not a power of two, ``block_n`` not a power of
            two >= 16 (a tensor-core tile), ``num_stages`` < 1 (named).
    """

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        # Checked here, not at each launch: a key tile of 0 runs and reads no key (silently
        # wrong output), and one not a power of two fails inside Triton naming no argument.
        for name, low, power in (
            ("block_m", 1, True),
            ("block_n", 16, True),
            ("num_warps", 1, True),
            ("num_stages", 1, False),
        ):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
            if not ok or (power and value & (value - 1)):
                kind = "a power of two" if power else "an int"
                raise ValueError(f"AttentionTiles.{name} must be {kind} >= {low}, got {value!r}")


def default_decode_tiles(dtype: torch.dtype, head_dim: int) -> AttentionTiles:
    """Small tiles for requests of a few queries: 16 rows (one decode query's heads, padded),
    64 keys a tile, 2 warps, 2 stages up to head_dim 128: the best of the H200 sweep
    (``benchmarks/paged_attention.py --sweep``, 256 decodes at 640 keys: 160.6 µs, against
    176.3 µs for the earlier 32 keys, 4 warps, 3 stages; docs/benchmarks.md)."""
    del dtype
    if head_dim > 128:
        return AttentionTiles(block_m=16, block_n=16, num_warps=4, num_stages=3)
    return AttentionTiles(block_m=16, block_n=64, num_warps=2, num_stages=2)


def default_split_tiles(dtype: torch.dtype, head_dim: int) -> AttentionTiles:
    """Tiles of the split-KV decode kernel: 16 rows x 64 keys, 4 warps, 2 stages up to
    head_dim 128 (best of the H200 sweep at 4 decodes of 8,192 keys: 39.9 µs)."""
    del dtype
    if head_dim > 128:
        return AttentionTiles(block_m=16, block_n=16, num_warps=4, num_stages=3)
    return AttentionTiles(block_m=16, block_n=64, num_warps=4, num_stages=2)


def default_prefill_tiles(dtype: torch.dtype, head_dim: int) -> AttentionTiles:
    """FlashAttention-2 tiles for prefill chunks: 64 rows x 64 keys, 4 warps, 2 stages for
    16-bit inputs up to head_dim 128, the best of the H200 sweep (16 prefills of 512 tokens:
    92.0 µs against 110.2 µs for Triton's fused-attention tutorial tile of 128 x 64, 8 warps,
    3 stages, and 100.1 µs for flash SDPA); smaller where the float32 accumulator or a wider
    head would not fit the registers."""
    if dtype == torch.float32:
        return AttentionTiles(block_m=32, block_n=32, num_warps=4, num_stages=2)
    if head_dim > 128:
        return AttentionTiles(block_m=64, block_n=32, num_warps=4, num_stages=2)
    return AttentionTiles(block_m=64, block_n=64, num_warps=4, num_stages=2)


def tile_rows(
    tiles: AttentionTiles, group: int, max_query_len: int | None = None
) -> tuple[int, int]:
    """``(BLOCK_Q, BLOCK_M)`` of a launch with ``tiles`` for GQA groups of ``group`` heads;
    ``max_query_len`` (a bound on the step's queries per request) may shrink ``BLOCK_Q``."""
    group_p = triton.next_power_of_2(group)
    block_q = max(1, tiles.block_m // group_p)
    if max_query_len is not None:
        block_q = min(block_q, triton.next_power_of_2(max(max_query_len, 1)))
    block_m = max(16, block_q * group_p)
    return block_m // group_p, block_m


def head_dim_padded(head_dim: int) -> int:
    """The power-of-two head dimension of a tile (at least 16, a tensor-core tile's K)."""
    padded: int = max(16, triton.next_power_of_2(head_dim))
    return padded


def dot_precision(dtype: torch.dtype) -> str:
    """IEEE dot products for float32 (exact parity tests), tensor cores otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"
