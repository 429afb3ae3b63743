"""Split-KV paged attention for decode steps of few requests with long contexts
(flash-decoding: Dao, Haziza, Massa & Sizov 2023; vLLM's ``kernel_unified_attention_3d`` and
``reduce_segments``).

Same layout, positions and masks as ``kernels.paged_attention``. With one program per
(request, kv head) a decode step of a few requests occupies a few SMs while each program walks
thousands of keys; here each request's keys are cut into ``num_segments`` slices attended by
separate programs, one per (request, kv head, segment), which write their unnormalised partial
results (float32: the row max ``m`` in log2 units, the sum of exponentials ``l``, the weighted
value sum ``acc``) to a workspace; ``_reduce_segments_kernel`` merges each (token, head)'s
slices by their log-sum-exp: ``out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s``.

A segment spans ``cdiv(key tiles of the request, num_segments)`` key tiles of ``BLOCK_N``
(computed on the device per request), so the grid depends only on ``num_reqs`` and
``num_segments``: a CUDA graph captured once replays for any context lengths. Segments past a
short request's keys are empty (``m = -inf``, ``l = 0``) and are skipped by the merge.

Every request must have at most ``BLOCK_Q`` queries (one q tile; ``max_query_len == 1`` for
decode steps); the launcher checks ``max_query_len`` against it.
"""

from __future__ import annotations

from typing import cast

import torch

from turnout.kernels._paged_tiles import (
    AttentionTiles,
    _attend_tiles,
    _key_tile_ranges,
    _load_query_tile,
    default_split_tiles,
    dot_precision,
    head_dim_padded,
    tile_rows,
)
from turnout.kernels._triton import require_triton, tl, triton
from turnout.kernels.paged_attention import _LOG2E, _check_attention, _request_scores_ref


@triton.jit  # type: ignore[untyped-decorator]
def _paged_attention_split_kernel(  # type: ignore[no-untyped-def]
    partial_m_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS] float32
    partial_l_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS] float32
    partial_acc_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS, HEAD_DIM] float32
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,
    sliding_window,
    q_stride_t,
    q_stride_h,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    block_table_stride,
    NUM_HEADS: tl.constexpr,
    NUM_QUERIES_PER_KV: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    seg = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if q_len == 0:  # a padding request: no token of it is merged
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len
    q, tok, head, q_rows, row_mask = _load_query_tile(
        q_ptr,
        q_start,
        0,
        q_len,
        kv_head,
        q_stride_t,
        q_stride_h,
        NUM_QUERIES_PER_KV,
        GROUP_P,
        HEAD_DIM,
        HEAD_DIM_P,
        BLOCK_M,
    )
    q_pos = context_len + tok
    lo, mid_lo, mid_hi, hi = _key_tile_ranges(
        context_len, seq_len - 1, sliding_window, USE_WINDOW, BLOCK_N
    )
    per_segment = tl.cdiv(hi - lo, NUM_SEGMENTS)
    seg_lo = lo + seg * per_segment
    seg_hi = tl.minimum(seg_lo + per_segment, hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    acc, m_i, l_i = _attend_tiles(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        k_cache_ptr,
        v_cache_ptr,
        bt_row,
        head_off,
        tl.maximum(lo, seg_lo),
        tl.minimum(mid_lo, seg_hi),
        seq_len,
        sliding_window,
        scale_log2,
        cache_stride_block,
        cache_stride_slot,
        HEAD_DIM,
        HEAD_DIM_P,
        KV_BLOCK_SIZE,
        BLOCK_N,
        True,
        USE_WINDOW,
        DOT_PRECISION,
    )
    acc, m_i, l_i = _attend_tiles(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        k_cache_ptr,
        v_cache_ptr,
        bt_row,
        head_off,
        tl.maximum(mid_lo, seg_lo),
        tl.minimum(mid_hi, seg_hi),
        seq_len,
        sliding_window,
        scale_log2,
        cache_stride_block,
        cache_stride_slot,
        HEAD_DIM,
        HEAD_DIM_P,
        KV_BLOCK_SIZE,
        BLOCK_N,
        False,
        USE_WINDOW,
        DOT_PRECISION,
    )
    acc, m_i, l_i = _attend_tiles(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        k_cache_ptr,
        v_cache_ptr,
        bt_row,
        head_off,
        tl.maximum(mid_hi, seg_lo),
        seg_hi,
        seq_len,
        sliding_window,
        scale_log2,
        cache_stride_block,
        cache_stride_slot,
        HEAD_DIM,
        HEAD_DIM_P,
        KV_BLOCK_SIZE,
        BLOCK_N,
        True,
        USE_WINDOW,
        DOT_PRECISION,
    )
    part = (q_rows * NUM_HEADS + head) * NUM_SEGMENTS + seg  # [BLOCK_M] int64
    tl.store(partial_m_ptr + part, m_i, mask=row_mask)
    tl.store(partial_l_ptr + part, l_i, mask=row_mask)
    dim = tl.arange(0, HEAD_DIM_P)
    tl.store(
        partial_acc_ptr + part[:, None] * HEAD_DIM + dim[None, :],
        acc,
        mask=row_mask[:, None] & (dim < HEAD_DIM)[None, :],
    )


@triton.jit  # type: ignore[untyped-decorator]
def _reduce_segments_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    partial_m_ptr,
    partial_l_ptr,
    partial_acc_ptr,
    query_start_loc_ptr,
    num_reqs,
    out_stride_t,
    out_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    SEGMENTS_P: tl.constexpr,
    SEGMENT_CHUNK: tl.constexpr,
):
    # One program per (token, head): the weights 2^(m_s - M) from all segments' maxima first,
    # then the accumulators SEGMENT_CHUNK segments at a time (a [segments, head_dim] float32
    # tile would not fit the registers); empty segments' accumulators are not read.
    token = tl.program_id(0)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_reqs):
        return  # a padding row: left as it is
    base = (token.to(tl.int64) * NUM_HEADS + head) * NUM_SEGMENTS
    segs = tl.arange(0, SEGMENTS_P)
    m = tl.load(partial_m_ptr + base + segs, mask=segs < NUM_SEGMENTS, other=float("-inf"))
    l_s = tl.load(partial_l_ptr + base + segs, mask=segs < NUM_SEGMENTS, other=0.0)
    m_max = tl.max(m, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    denom = tl.sum(tl.exp2(m - m_use) * l_s, 0)
    dim = tl.arange(0, HEAD_DIM_P)
    acc = tl.zeros([HEAD_DIM_P], dtype=tl.float32)
    for start in range(0, NUM_SEGMENTS, SEGMENT_CHUNK):
        chunk = start + tl.arange(0, SEGMENT_CHUNK)
        m_c = tl.load(partial_m_ptr + base + chunk, mask=chunk < NUM_SEGMENTS, other=float("-inf"))
        read = (m_c > float("-inf"))[:, None] & (dim < HEAD_DIM)[None, :]
        a = tl.load(
            partial_acc_ptr + (base + chunk)[:, None] * HEAD_DIM + dim[None, :],
            mask=read,
            other=0.0,
        )
        acc += tl.sum(a * tl.exp2(m_c - m_use)[:, None], 0)
    acc = acc / tl.where(denom == 0.0, 1.0, denom)
    tl.store(
        out_ptr + token.to(tl.int64) * out_stride_t + head * out_stride_h + dim,
        acc.to(out_ptr.dtype.element_ty),
        mask=dim < HEAD_DIM,
    )


#: Most segments :func:`num_segments_for` picks (and the reduce's per-chunk tile bound).
MAX_SEGMENTS = 64
#: Programs per SM that :func:`num_segments_for` aims at (two waves of the H200's 132 SMs).
TARGET_PROGRAMS_PER_SM = 2


def num_segments_for(num_reqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Segments per request: doubled until the (request, kv head, segment) programs fill
    ``TARGET_PROGRAMS_PER_SM`` waves of the device's SMs, at most ``MAX_SEGMENTS``; 4 off CUDA.
    Host facts only, so a CUDA graph's grid stays valid for any context lengths."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    target = TARGET_PROGRAMS_PER_SM * torch.cuda.get_device_properties(index).multi_processor_count
    segments = 1
    while segments < MAX_SEGMENTS and max(num_reqs, 1) * num_kv_heads * segments < target:
        segments *= 2
    return segments


def split_workspace_numel(num_tokens: int, num_heads: int, head_dim: int, num_segments: int) -> int:
    """Float32 elements of the workspace of :func:`paged_attention_split`: ``m``, ``l`` and
    ``acc`` of every (token, head, segment)."""
    return num_tokens * num_heads * num_segments * (head_dim + 2)


def paged_attention_split(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32/float16/bfloat16
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], query's dtype
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32, keys per request after this step
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks_per_req] int32
    max_query_len: int,  # host int >= the longest query; at most the tile's BLOCK_Q
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim], written in place
    *,
    num_segments: int | None = None,  # key slices per request; default num_segments_for(...)
    tiles: AttentionTiles | None = None,  # default: default_split_tiles(...)
    workspace: torch.Tensor | None = None,  # [>= split_workspace_numel(...)] float32
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query's dtype
    """Causal paged attention of a decode step with each request's keys split over
    ``num_segments`` programs (Triton; see the module docstring). Two launches: the segments,
    then the merge. Rows of ``out`` past ``query_start_loc[-1]`` are not written.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations; ``max_query_len``
            exceeds one tile's queries; ``num_segments`` not an int >= 1; ``workspace`` too small or not a
            contiguous float32 tensor on the query's device.
    """
    require_triton()
    out = _check_attention(query, kv_cache, query_start_loc, seq_lens, block_table, out)
    num_tokens, num_heads, head_dim = query.shape
    num_reqs, num_kv_heads = seq_lens.shape[0], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    tiles = tiles or default_split_tiles(query.dtype, head_dim)
    block_q, block_m = tile_rows(tiles, group)
    if max_query_len > block_q:
        raise ValueError(
            f"max_query_len={max_query_len} exceeds the {block_q} queries of one "
            f"split-KV tile (block_m={tiles.block_m}, {group} heads per kv head)"
        )
    segments = (
        num_segments_for(num_reqs, num_kv_heads, query.device)
        if num_segments is None
        else num_segments
    )
    _check_segments(segments)
    if num_reqs == 0 or max_query_len == 0 or num_tokens == 0:
        return out
    m, l_s, acc = _workspace_views(workspace, query, segments)
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    _paged_attention_split_kernel[(num_reqs, num_kv_heads, segments)](
        m,
        l_s,
        acc,
        query,
        key_cache,
        value_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale * _LOG2E,
        sliding_window or 0,
        query.stride(0),
        query.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_table.stride(0),
        NUM_HEADS=num_heads,
        NUM_QUERIES_PER_KV=group,
        GROUP_P=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_padded(head_dim),
        KV_BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_M=block_m,
        BLOCK_N=tiles.block_n,
        NUM_SEGMENTS=segments,
        USE_WINDOW=bool(sliding_window),
        DOT_PRECISION=dot_precision(query.dtype),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    segments_p = triton.next_power_of_2(segments)
    _reduce_segments_kernel[(num_tokens, num_heads)](
        out,
        m,
        l_s,
        acc,
        query_start_loc,
        num_reqs,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_padded(head_dim),
        NUM_SEGMENTS=segments,
        SEGMENTS_P=segments_p,
        SEGMENT_CHUNK=min(segments_p, 16),
    )
    return out


def _check_segments(segments: object) -> None:
    # 0 is refused, not taken for "the default" (None is the default)
    if not isinstance(segments, int) or isinstance(segments, bool) or segments < 1:
        raise ValueError(f"num_segments must be an int >= 1, got {segments!r}")


def _workspace_views(
    workspace: torch.Tensor | None, query: torch.Tensor, segments: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens, num_heads, head_dim = query.shape
    need = split_workspace_numel(num_tokens, num_heads, head_dim, segments)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=query.device)
    elif (
        workspace.dtype != torch.float32
        or not workspace.is_contiguous()
        or workspace.numel() < need
        or workspace.device != query.device
    ):
        raise ValueError(
            f"workspace must be a contiguous float32 tensor of >= {need} elements "
            f"on {query.device}, got {tuple(workspace.shape)} {workspace.dtype} "
            f"on {workspace.device}"
        )
    flat = workspace.view(-1)
    n = num_tokens * num_heads * segments
    return flat[:n], flat[n : 2 * n], flat[2 * n : need]


def paged_attention_split_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks_per_req] int32
    max_query_len: int,  # unused; kept so both functions take the same arguments
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim], written in place
    *,
    num_segments: int | None = None,  # key slices per request (default 4)
    tiles: AttentionTiles | None = None,  # unused: the reference has no tiles
    workspace: torch.Tensor | None = None,  # unused
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query's dtype
    """Torch reference of :func:`paged_attention_split`: each request's keys cut into
    ``num_segments`` slices of ``cdiv(seq_len, num_segments)`` keys, each slice's partial
    (max, sum, weighted values) from :func:`paged_attention_ref` on it, merged by log-sum-exp.
    Equals :func:`kernels.paged_attention.paged_attention_ref` up to float32 rounding.

    Raises:
        ValueError: shapes, dtypes or strides do not match the annotations; ``num_segments``
            not an int >= 1.
    """
    del max_query_len, tiles, workspace
    out = _check_attention(query, kv_cache, query_start_loc, seq_lens, block_table, out)
    segments = 4 if num_segments is None else num_segments
    _check_segments(segments)
    for q_start, q_end, scores, v in _request_scores_ref(
        query, kv_cache, query_start_loc, seq_lens, block_table, scale, sliding_window
    ):
        seq_len = v.shape[0]
        per = -(-seq_len // segments)
        parts = [
            _segment_partial(scores[..., s : s + per], v[s : s + per])
            for s in range(0, seq_len, per)
        ]
        out[q_start:q_end] = _merge(parts).to(out.dtype)
    return out


def _segment_partial(
    scores: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = scores.amax(-1)  # [h, q]
    p = (scores - torch.where(m.isinf(), 0.0, m)[..., None]).exp()
    return m, p.sum(-1), torch.einsum("hqk,khd->qhd", p, v)


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    m = torch.stack([p[0] for p in parts])  # [segments, h, q]
    top = m.amax(0)
    w = (m - torch.where(top.isinf(), 0.0, top)).exp()  # 0 for empty segments
    # sum() starts from the int 0; parts is never empty, so both sums are tensors.
    num = cast(torch.Tensor, sum(w[s].T[..., None] * parts[s][2] for s in range(len(parts))))
    den = cast(torch.Tensor, sum(w[s] * parts[s][1] for s in range(len(parts)))).T[..., None]
    return num / torch.where(den == 0, 1.0, den)


__all__ = [
    "MAX_SEGMENTS",
    "TARGET_PROGRAMS_PER_SM",
    "num_segments_for",
    "paged_attention_split",
    "paged_attention_split_ref",
    "split_workspace_numel",
]
