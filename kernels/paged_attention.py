"""Paged attention over a block-table KV cache: varlen prefill + decode, GQA, CUDA-graph grids.

Layout (one tensor per layer, docs/architecture.md §5.2 / docs/model-layer.md):
``kv_cache[0]`` keys and ``kv_cache[1]`` values, each ``[num_blocks, block_size, num_kv_heads,
head_dim]``; token ``j`` of request ``i`` lives in block ``block_table[i, j // block_size]`` at
offset ``j % block_size``. The tokens of a step are packed request after request
(``query_start_loc``); request ``i``'s queries are its last ``q_len`` positions, so query ``t``
sits at position ``seq_lens[i] - q_len + t`` and attends causally to keys ``0..position``
(and only to the last ``sliding_window`` of them when one is given: keys ``n`` with
``position - n < sliding_window``, as HF's sliding-window mask).

**Grid.** One program per (q block, kv head). The q blocks are numbered over the whole step:
request ``i`` owns blocks ``query_start_loc[i] // BLOCK_Q + i`` onwards, so
``num_tokens // BLOCK_Q + num_reqs`` blocks cover any batch of ``num_tokens`` rows and
``num_reqs`` requests, whatever their split (vLLM's ``kernel_unified_attention_2d``,
``find_seq_idx``). Each program finds its request by binary search over ``query_start_loc`` and
returns at once when its block lies past the request's queries. The grid depends on two host
ints that are fixed for a padded CUDA-graph batch, never on the step's query lengths; padding
requests (empty queries, ``seq_lens`` 0) cost one early-returning program each.

**Tiles.** A tile's ``BLOCK_M`` rows are ``BLOCK_Q`` queries times the ``num_queries_per_kv``
query heads that share the kv head (padded to a power of two), so K/V are read once per kv
head and even a decode step fills a tensor-core tile (vLLM PR #21197). Keys stream ``BLOCK_N``
at a time (tiles aligned to multiples of ``BLOCK_N``) with an online softmax in float32, exp2
(Milakov & Gimelshein 2018; FlashAttention-2, Dao 2023). The key tiles of a q tile split into
the ones every query of the tile sees whole (before its first query, inside every window),
which run without mask arithmetic, and the diagonal (and window-edge) tiles, which apply the
causal/window mask. Each key's physical slot is looked up per key, so any ``block_size`` works.

A step runs as up to two launches of the same kernel (:class:`AttentionTiles`): requests of at
most ``decode_tiles``' ``BLOCK_Q`` queries (decodes, short speculative runs) on small tiles, one
program per (request, kv head), no search; longer ones (prefill chunks) on FlashAttention-2
tiles over the flattened grid. Each launch skips the other's requests, so both grids stay
graph-friendly. On CUDA the two launches of a mixed step overlap: the prefill launch goes first
on the current stream, the decode launch on a side stream forked from it and joined back before
``paged_attention`` returns (so a CUDA graph captures them as two parallel branches). The prefill
tiles are bound by the tensor cores, the decode tiles by reading the KV cache; run one after the
other, each leaves the other's resource idle (``set_overlapped_launches(False)`` serialises them,
for benchmarks). Split-KV decoding is ``kernels.paged_attention_split``.

``reshape_and_cache`` writes the step's keys/values to their slots (``slot_mapping``; ``-1``
marks padding and is skipped), vLLM's op of the same name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat, check_vector
from turnout.kernels._paged_tiles import (
    AttentionTiles,
    _attend_tiles,
    _find_request,
    _key_tile_ranges,
    _load_query_tile,
    _zero_padding_rows,
    default_decode_tiles,
    default_prefill_tiles,
    dot_precision,
    head_dim_padded,
    tile_rows,
)
from turnout.kernels._streams import run_overlapped
from turnout.kernels._triton import require_triton, tl, triton

_LOG2E = 1.4426950408889634
_INT32_MAX = 2**31 - 1
_overlap = {"enabled": True}


def set_overlapped_launches(enabled: bool) -> bool:
    """Whether a mixed step's decode and prefill launches overlap on CUDA (default ``True``);
    returns the previous setting. Read at launch time: a CUDA graph keeps what it captured."""
    previous = _overlap["enabled"]
    _overlap["enabled"] = bool(enabled)
    return previous


@triton.jit(do_not_specialize=["num_reqs", "num_tokens"])  # type: ignore[untyped-decorator]  # one variant whatever the batch
def _paged_attention_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,  # softmax scale * log2(e): the kernel exponentiates with exp2
    sliding_window,
    num_reqs,
    num_tokens,  # rows of out (a padded batch's rows past query_start_loc[num_reqs] included)
    min_q_len,  # this launch serves the requests with min_q_len <= q_len <= max_q_len
    max_q_len,
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    block_table_stride,
    NUM_QUERIES_PER_KV: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    REQUEST_PER_PROGRAM: tl.constexpr,  # grid (num_reqs, kv heads), else the flattened q blocks
    ZERO_PADDING: tl.constexpr,  # program (0, kv head) zeroes the padding rows of its heads
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" keeps float32 exact; "tf32" is the default otherwise
):
    kv_head = tl.program_id(1)
    if ZERO_PADDING:  # noqa: SIM102 (a constexpr test, then a runtime one: Triton keeps them apart)
        if tl.program_id(0) == 0:
            _zero_padding_rows(
                out_ptr,
                query_start_loc_ptr,
                num_reqs,
                num_tokens,
                kv_head,
                out_stride_t,
                out_stride_h,
                NUM_QUERIES_PER_KV,
                HEAD_DIM,
                HEAD_DIM_P,
                16,
            )
    if REQUEST_PER_PROGRAM:  # every request served fits one q tile: program i is request i
        req = tl.program_id(0)
        q_start = tl.load(query_start_loc_ptr + req)
        q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
        first = q_len * 0
    else:
        # Last q blocks first: a request's later blocks see more keys (causal), so the longest
        # programs start early and the short ones fill the tail of the wave.
        q_block = tl.num_programs(0) - 1 - tl.program_id(0)
        req = _find_request(query_start_loc_ptr, q_block, num_reqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + req)
        q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
        first = (q_block - q_start // BLOCK_Q - req) * BLOCK_Q  # first query of the tile
    if (first >= q_len) | (q_len < min_q_len) | (q_len > max_q_len):
        return  # past the request's queries, or served by the other launch
    context_len = tl.load(seq_lens_ptr + req) - q_len
    q, tok, head, q_rows, row_mask = _load_query_tile(
        q_ptr,
        q_start,
        first,
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
    first_pos = context_len + first
    last_pos = context_len + tl.minimum(first + BLOCK_Q, q_len) - 1
    lo, mid_lo, mid_hi, hi = _key_tile_ranges(
        first_pos, last_pos, sliding_window, USE_WINDOW, BLOCK_N
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    kv_end = last_pos + 1
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
        lo,
        mid_lo,
        kv_end,
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
        mid_lo,
        mid_hi,
        kv_end,
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
        mid_hi,
        hi,
        kv_end,
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
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    dim = tl.arange(0, HEAD_DIM_P)
    tl.store(
        out_ptr + q_rows[:, None] * out_stride_t + head[:, None] * out_stride_h + dim[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & (dim < HEAD_DIM)[None, :],
    )


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32/float16/bfloat16
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], query's dtype
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32, keys per request after this step
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks_per_req] int32
    max_query_len: int,  # host int >= the longest query: picks tiles (no device sync)
    scale: float,  # softmax scale, usually head_dim ** -0.5
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim], written in place
    *,
    decode_tiles: AttentionTiles | None = None,  # default: default_decode_tiles(...)
    prefill_tiles: AttentionTiles | None = None,  # default: default_prefill_tiles(...)
    split_short_queries: bool = True,  # mixed steps: short requests on decode tiles
    zero_padding: bool = False,  # zero out's rows past query_start_loc[num_reqs]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query's dtype
    """Causal paged attention for a packed varlen batch (Triton). See the module docstring.

    When ``max_query_len`` fits one decode tile (``BLOCK_Q`` of ``decode_tiles``) one launch
    on decode tiles serves the step; otherwise requests of up to that many queries run on
    decode tiles and the others on ``prefill_tiles`` (two launches, overlapped on CUDA; with
    ``split_short_queries=False`` one launch on prefill tiles). Grids depend only on
    ``num_tokens``, ``num_reqs`` and the tiles, so a CUDA graph replays for any lengths whose
    longest query is at most the captured ``max_query_len``. Rows of ``out`` past
    ``query_start_loc[num_reqs]`` (CUDA-graph padding) are not written, or, with
    ``zero_padding``, set to zero by the launch that serves the empty requests (the decode-tile
    one, issued second when the two overlap; the only one otherwise), so ``out`` may come from
    ``torch.empty``: no separate fill of the whole output per layer.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    require_triton()
    out = _check_attention(query, kv_cache, query_start_loc, seq_lens, block_table, out)
    num_reqs = seq_lens.shape[0]
    if num_reqs == 0 or max_query_len == 0:
        return out.zero_() if zero_padding else out
    head_dim, group = query.shape[2], query.shape[1] // kv_cache.shape[3]
    decode = decode_tiles or default_decode_tiles(query.dtype, head_dim)
    prefill = prefill_tiles or default_prefill_tiles(query.dtype, head_dim)
    short_q, _ = tile_rows(decode, group)
    args = (
        out,
        query,
        kv_cache,
        query_start_loc,
        seq_lens,
        block_table,
        max_query_len,
        scale,
        sliding_window,
    )
    # The launch serving q_len 0 (padding requests) also zeroes the padding rows when asked.
    if max_query_len <= short_q:
        _launch(*args, decode, 0, short_q, zero_padding)
    elif split_short_queries and query.is_cuda and _overlap["enabled"]:
        run_overlapped(
            query.device,
            lambda: _launch(*args, prefill, short_q + 1, _INT32_MAX, False),
            lambda: _launch(*args, decode, 0, short_q, zero_padding),
        )
    elif split_short_queries:
        _launch(*args, decode, 0, short_q, zero_padding)
        _launch(*args, prefill, short_q + 1, _INT32_MAX, False)
    else:
        _launch(*args, prefill, 0, _INT32_MAX, zero_padding)
    return out


def _launch(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: int | None,
    tiles: AttentionTiles,
    min_q_len: int,
    max_q_len: int,
    zero_padding: bool,
) -> None:
    num_tokens, num_heads, head_dim = query.shape
    num_reqs, num_kv_heads = seq_lens.shape[0], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    block_q, block_m = tile_rows(tiles, group, max_query_len)
    # Requests of at most BLOCK_Q queries need one program each, no search: a decode launch
    # (or the short-request half of a mixed step) has num_reqs programs per kv head.
    per_request = max_q_len <= block_q
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    grid = (num_reqs if per_request else num_tokens // block_q + num_reqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale * _LOG2E,
        sliding_window or 0,
        num_reqs,
        num_tokens,
        min_q_len,
        max_q_len,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_table.stride(0),
        NUM_QUERIES_PER_KV=group,
        GROUP_P=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_padded(head_dim),
        KV_BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=tiles.block_n,
        REQUEST_PER_PROGRAM=per_request,
        ZERO_PADDING=zero_padding,
        USE_WINDOW=bool(sliding_window),
        DOT_PRECISION=dot_precision(query.dtype),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def paged_attention_ref(
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
    decode_tiles: AttentionTiles | None = None,  # unused: the reference has no tiles
    prefill_tiles: AttentionTiles | None = None,  # unused
    split_short_queries: bool = True,  # unused
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], query's dtype
    """Torch reference of :func:`paged_attention` (what CPU runs use): one request at a time,
    keys gathered from their blocks, softmax in float32. Reads lengths to the host.

    Raises:
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    del max_query_len, decode_tiles, prefill_tiles, split_short_queries
    out = _check_attention(query, kv_cache, query_start_loc, seq_lens, block_table, out)
    for q_start, q_end, scores, v in _request_scores_ref(
        query, kv_cache, query_start_loc, seq_lens, block_table, scale, sliding_window
    ):
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(out.dtype)
    return out


def _request_scores_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """For each request with queries (the references' common part; reads lengths to the host):
    ``(q_start, q_end, scores [H, q_len, seq_len] float32 masked with -inf, v [seq_len, H, D]
    float32)``, keys and values gathered from the request's blocks, GQA heads repeated."""
    group = query.shape[1] // kv_cache.shape[3]
    block_size = kv_cache.shape[2]
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        if q_end == q_start:
            continue
        blocks = block_table[i, : -(-seq_len // block_size)].long()
        k = kv_cache[0, blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, dim=1)
        v = kv_cache[1, blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[q_start:q_end].float(), k) * scale
        allowed = _causal_mask(q_end - q_start, seq_len, sliding_window, query.device)
        yield q_start, q_end, scores.masked_fill(~allowed, float("-inf")), v


def _causal_mask(
    q_len: int, seq_len: int, window: int | None, device: torch.device
) -> torch.Tensor:  # [q_len, seq_len] bool
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    allowed = k_pos <= q_pos
    if window:
        allowed &= q_pos - k_pos < window
    return allowed


def _check_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor | None,
) -> torch.Tensor:
    if query.dim() != 3 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            f"query must be [T, H, D] and kv_cache [2, blocks, block_size, H_kv, D], "
            f"got {tuple(query.shape)} and {tuple(kv_cache.shape)}"
        )
    if query.shape[2] != kv_cache.shape[4] or query.shape[1] % kv_cache.shape[3]:
        raise ValueError(
            f"head layout of query {tuple(query.shape)} does not fit kv_cache "
            f"{tuple(kv_cache.shape)} (head_dim equal, heads a multiple of kv heads)"
        )
    if query.dtype != kv_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} != kv_cache dtype {kv_cache.dtype}")
    i32 = torch.int32
    check_dtypes(
        query_start_loc=(query_start_loc, i32),
        seq_lens=(seq_lens, i32),
        block_table=(block_table, i32),
    )
    check_flat(query_start_loc=query_start_loc, seq_lens=seq_lens)
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1 or block_table.dim() != 2:
        raise ValueError("query_start_loc must have num_reqs + 1 entries and block_table 2 dims")
    check_at_least(seq_lens.shape[0], "num_reqs", block_table=block_table)
    if query.stride(2) != 1 or kv_cache.stride(4) != 1 or block_table.stride(1) != 1:
        raise ValueError("query, kv_cache and block_table need a unit stride in the last dim")
    if out is None:
        return torch.zeros_like(query)
    if out.shape != query.shape or out.dtype != query.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be {tuple(query.shape)} {query.dtype} with unit last stride")
    return out


@triton.jit  # type: ignore[untyped-decorator]
def _reshape_and_cache_kernel(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    cache_stride_slot,
    cache_stride_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:  # padding token of a CUDA-graph batch: nothing to write
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    t = token.to(tl.int64)
    k = tl.load(key_ptr + t * key_stride_t + h * key_stride_h + d, mask=mask)
    v = tl.load(value_ptr + t * value_stride_t + h * value_stride_h + d, mask=mask)
    dst = slot.to(tl.int64) * cache_stride_slot + h * cache_stride_head + d
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], written
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Write each token's key/value to ``kv_cache`` at its slot (Triton; one program a token).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    require_triton()
    _check_cache_write(key, value, kv_cache, slot_mapping)
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        kv_cache[0],
        kv_cache[1],
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


def reshape_and_cache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], written
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Torch reference of :func:`reshape_and_cache` (boolean indexing: syncs on CUDA).

    Raises:
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    _check_cache_write(key, value, kv_cache, slot_mapping)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    kv_cache[0].view(-1, *kv_cache.shape[3:])[slots] = key[valid]
    kv_cache[1].view(-1, *kv_cache.shape[3:])[slots] = value[valid]


def _check_cache_write(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    if (
        key.shape != value.shape
        or key.dim() != 3
        or tuple(key.shape[1:]) != tuple(kv_cache.shape[3:])
        or kv_cache.shape[0] != 2
    ):
        raise ValueError(
            f"key/value {tuple(key.shape)}/{tuple(value.shape)} do not fit kv_cache "
            f"{tuple(kv_cache.shape)}"
        )
    if key.dtype != kv_cache.dtype or value.dtype != kv_cache.dtype:
        raise ValueError(f"key/value dtype must equal kv_cache dtype {kv_cache.dtype}")
    check_vector("slot_mapping", slot_mapping, torch.int64, key.shape[0])
    if not kv_cache.is_contiguous() or key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("kv_cache must be contiguous and key/value need a unit last stride")


def default_scale(head_dim: int) -> float:
    """The softmax scale of scaled dot-product attention, ``1 / sqrt(head_dim)``
    (Vaswani et al. 2017)."""
    return 1.0 / math.sqrt(head_dim)


__all__ = [
    "AttentionTiles",
    "default_decode_tiles",
    "default_prefill_tiles",
    "default_scale",
    "paged_attention",
    "paged_attention_ref",
    "reshape_and_cache",
    "reshape_and_cache_ref",
    "tile_rows",
]
