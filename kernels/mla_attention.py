"""Multi-head latent attention (MLA, DeepSeek-V2) over a paged *latent* cache.

Layout (one tensor per layer, docs/model-layer.md): ``kv_cache`` is ``[num_blocks, block_size,
kv_lora_rank + qk_rope_head_dim]``; slot ``s`` holds one token's compressed KV ``c_kv``
(``[:kv_lora_rank]``, after ``kv_a_layernorm``) followed by its shared rotary key ``k_pe``
(``[kv_lora_rank:]``, after RoPE). Token ``j`` of request ``i`` lives in block
``block_table[i, j // block_size]`` at offset ``j % block_size``, as in ``kernels.paged_attention``.

The attention runs in the latent space (DeepSeek-V2 paper, arXiv:2405.04434 §2.1.2, "absorbing"
``W^UK`` into the query and ``W^UV`` into the output; vLLM's MLA backends,
``vllm/v1/attention/backends/mla/``): the caller passes ``query = [q_nope @ W_UK, q_pe]`` per
head (``[T, H, kv_lora_rank + rope]``), every head scores the same latent row of each key
(``score = query . kv_cache[slot]``), and the output is the probability-weighted sum of the
``c_kv`` parts (``[T, H, kv_lora_rank]``), which the caller maps through ``W_UV``. It is
multi-query attention with one 576-wide key and 512-wide value per token (V2-Lite): the cache is
read once per step, whatever the number of heads.

One kernel serves decode and varlen prefill alike (causal, packed request after request: query
``t`` of request ``i`` sits at position ``seq_lens[i] - q_len + t`` and sees keys
``0..position``). One program per (request, group of ``BLOCK_H`` heads, tile of ``BLOCK_Q``
queries); a tile's rows are queries x heads, so a decode step fills a tensor-core tile with the
heads of one query (the head packing of vLLM's Triton MLA decode kernel, from SGLang's
``decode_attention_fwd_grouped``). Keys stream ``BLOCK_N`` at a time with an online softmax in
float32; the ``c_kv`` tile loaded for the scores is reused as the value tile.

The step's latent rows are written by ``kernels.mla_cache.concat_and_cache_mla``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat
from turnout.kernels._triton import require_triton, tl, triton

_LOG2E = 1.4426950408889634


@triton.jit  # type: ignore[untyped-decorator]
def _mla_attention_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    partial_lse_ptr,  # [T, H, NUM_SPLITS] float32 (split decode only)
    q_ptr,
    kv_cache_ptr,
    block_table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,  # softmax scale * log2(e): the kernel exponentiates with exp2
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    cache_stride_block,
    cache_stride_slot,
    block_table_stride,
    NUM_SPLITS: tl.constexpr,  # > 1: each program attends to one slice of the keys (decode)
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    KV_LORA_RANK: tl.constexpr,
    LORA_P: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    ROPE_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" keeps float32 exact; "tf32" is the default otherwise
):
    req = tl.program_id(0)
    head_group = tl.program_id(1)
    q_tile = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:  # the grid is sized by the longest query of the step
        return
    context_len = tl.load(seq_lens_ptr + req) - q_len

    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // BLOCK_H  # query index inside the request
    head = head_group * BLOCK_H + rows % BLOCK_H
    row_mask = (tok < q_len) & (head < NUM_HEADS)
    c = tl.arange(0, LORA_P)
    c_mask = c < KV_LORA_RANK
    r = tl.arange(0, ROPE_P)
    r_mask = r < ROPE_DIM
    q_rows = (q_start + tok).to(tl.int64)
    q_row_ptr = q_ptr + q_rows[:, None] * q_stride_t + head[:, None] * q_stride_h
    q_lat = tl.load(q_row_ptr + c[None, :], mask=row_mask[:, None] & c_mask[None, :], other=0.0)
    q_pe = tl.load(
        q_row_ptr + KV_LORA_RANK + r[None, :], mask=row_mask[:, None] & r_mask[None, :], other=0.0
    )
    q_pos = context_len + tok

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, LORA_P], dtype=tl.float32)
    kv_end = context_len + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)
    kv_start = 0
    if NUM_SPLITS > 1:  # this program's slice of the keys, whole BLOCK_N tiles
        per_split = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        kv_start = split * per_split
        kv_end = tl.minimum(kv_end, kv_start + per_split)
    bt_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    for start in range(kv_start, kv_end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_mask = n < kv_end
        block = tl.load(bt_row + n // KV_BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot_off = block * cache_stride_block + (n % KV_BLOCK_SIZE) * cache_stride_slot
        # [BLOCK_N, LORA_P]: the keys' latent part, and (the same tile) the values.
        kv_lat = tl.load(
            kv_cache_ptr + slot_off[:, None] + c[None, :],
            mask=n_mask[:, None] & c_mask[None, :],
            other=0.0,
        )
        k_pe = tl.load(
            kv_cache_ptr + slot_off[None, :] + KV_LORA_RANK + r[:, None],
            mask=n_mask[None, :] & r_mask[:, None],
            other=0.0,
        )  # [ROPE_P, BLOCK_N]
        s = tl.dot(q_lat, tl.trans(kv_lat), input_precision=DOT_PRECISION)
        s = tl.dot(q_pe, k_pe, acc=s, input_precision=DOT_PRECISION) * scale_log2
        allowed = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(kv_lat.dtype), kv_lat, input_precision=DOT_PRECISION
        )
        m_i = m_new
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if NUM_SPLITS > 1:  # normalised partial output + its log-sum-exp (base 2), merged later
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        part = (q_rows * NUM_HEADS + head) * NUM_SPLITS + split
        tl.store(partial_lse_ptr + part, lse, mask=row_mask)
        tl.store(
            out_ptr + part[:, None] * KV_LORA_RANK + c[None, :],
            acc,
            mask=row_mask[:, None] & c_mask[None, :],
        )
    else:
        tl.store(
            out_ptr + q_rows[:, None] * out_stride_t + head[:, None] * out_stride_h + c[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & c_mask[None, :],
        )


@triton.jit  # type: ignore[untyped-decorator]
def _mla_merge_splits_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    partial_out_ptr,  # [T, H, NUM_SPLITS, KV_LORA_RANK] float32
    partial_lse_ptr,  # [T, H, NUM_SPLITS] float32, base 2
    query_start_loc_ptr,
    num_reqs,
    out_stride_t,
    out_stride_h,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    KV_LORA_RANK: tl.constexpr,
    LORA_P: tl.constexpr,
):
    # One program per (token, head): the splits' outputs weighted by exp2(lse - max lse),
    # SPLIT_CHUNK splits at a time with an online rescale across chunks (as the attention
    # itself); the outputs of empty splits (lse -inf) are not read.
    token = tl.program_id(0)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_reqs):  # CUDA-graph padding rows
        return
    part = (token.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS
    c = tl.arange(0, LORA_P)
    c_mask = c < KV_LORA_RANK
    m = float("-inf")
    total = 0.0
    acc = tl.zeros([LORA_P], dtype=tl.float32)
    for start in range(0, NUM_SPLITS, SPLIT_CHUNK):
        splits = start + tl.arange(0, SPLIT_CHUNK)
        lse = tl.load(partial_lse_ptr + part + splits)
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m_safe))
        alpha = tl.exp2(m - m_safe)
        o = tl.load(
            partial_out_ptr + (part + splits)[:, None] * KV_LORA_RANK + c[None, :],
            mask=(lse != float("-inf"))[:, None] & c_mask[None, :],
            other=0.0,
        )
        acc = acc * alpha + tl.sum(o * w[:, None], 0)
        total = total * alpha + tl.sum(w, 0)
        m = m_new
    merged = acc / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + token.to(tl.int64) * out_stride_t + head * out_stride_h + c,
        merged.to(out_ptr.dtype.element_ty),
        mask=c_mask,
    )


def mla_tiles(
    num_heads: int, max_query_len: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int, int, int]:
    """``(BLOCK_H, BLOCK_Q, BLOCK_M, BLOCK_N)`` of a launch: up to 16 heads of one query per
    group of tile rows (a decode tile is the heads of one token), more queries per tile for
    prefills, at least 16 rows (the smallest tensor-core tile); keys ``BLOCK_N`` at a time.
    Measured on an H200 at DeepSeek-V2-Lite's shape (docs/model-layer.md): decode 16 x 32,
    prefill 64 x 64 in bf16; float32 (exact tests) keeps 16/32 x 16, its tiles being twice as
    large in memory."""
    block_h = min(triton.next_power_of_2(num_heads), 16)
    fp32 = dtype == torch.float32
    rows = 16 if max_query_len == 1 else (32 if fp32 else 64)  # the fp32 [rows, rank] accumulator
    block_q = max(1, min(triton.next_power_of_2(max_query_len), rows // block_h))
    block_m = max(16, block_q * block_h)
    block_n = 16 if fp32 else (32 if max_query_len == 1 else 64)
    return block_h, block_m // block_h, block_m, block_n


#: Most key slices of a split decode (flash-decoding, Dao et al. 2023).
MAX_KV_SPLITS = 64


def num_kv_splits_for(num_reqs: int, num_head_groups: int, device: torch.device) -> int:
    """Key slices per decode request: doubled while the batch's programs do not fill one wave
    of the GPU's SMs (a decode batch of few requests otherwise runs on a handful of them), up
    to ``MAX_KV_SPLITS``; 1 off CUDA. Measured on an H200 (132 SMs, DeepSeek-V2-Lite): 256
    requests run fastest unsplit, 32 with 8 slices. Depends on host facts only, so a CUDA
    graph captured for ``num_reqs`` requests keeps its grid valid for any context lengths."""
    if device.type != "cuda" or num_reqs == 0:
        return 1
    programs = num_reqs * num_head_groups
    sms = _num_sms(device)
    splits = 1
    while splits < MAX_KV_SPLITS and programs * splits < sms:
        splits *= 2
    return splits


_SM_COUNTS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]


def mla_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, kv_lora_rank + rope_dim] float32/float16/bfloat16
    kv_cache: torch.Tensor,  # [num_blocks, block_size, kv_lora_rank + rope_dim], query's dtype
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32, keys per request after this step
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks_per_req] int32
    max_query_len: int,  # host int: sizes the grid (no device sync)
    scale: float,  # softmax scale (DeepSeek: qk_head_dim ** -0.5, times YaRN's mscale ** 2)
    kv_lora_rank: int,  # latent width; the rest of each cache row is the rotary key
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, kv_lora_rank], written in place
    num_kv_splits: int | None = None,  # decode only: key slices per request (None: by size)
) -> torch.Tensor:  # [num_tokens, num_heads, kv_lora_rank], query's dtype
    """Causal latent attention for a packed varlen batch (Triton). See the module docstring.

    A decode batch (``max_query_len == 1``) may split each request's keys into
    ``num_kv_splits`` slices attended by separate programs, whose normalised outputs and
    log-sum-exps a second kernel merges (flash-decoding); ``None`` picks the count from the
    batch size (:func:`num_kv_splits_for`). Rows of ``out`` past ``query_start_loc[-1]``
    (CUDA-graph padding) are not written.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations, or
            ``num_kv_splits`` is not a power of two in ``[1, MAX_KV_SPLITS]`` (or is above 1
            for a batch with prefill tokens).
    """
    require_triton()
    out = _check_mla(query, kv_cache, query_start_loc, seq_lens, block_table, kv_lora_rank, out)
    num_reqs = seq_lens.shape[0]
    if num_reqs == 0 or max_query_len == 0:
        return out
    num_heads, rope_dim = query.shape[1], query.shape[2] - kv_lora_rank
    block_h, block_q, block_m, block_n = mla_tiles(num_heads, max_query_len, query.dtype)
    num_head_groups = triton.cdiv(num_heads, block_h)
    splits = _splits(num_kv_splits, max_query_len, num_reqs, num_head_groups, query.device)
    fp32 = query.dtype == torch.float32
    lora_p = max(16, triton.next_power_of_2(kv_lora_rank))
    if splits > 1:
        partial_out = query.new_empty(
            (query.shape[0], num_heads, splits, kv_lora_rank), dtype=torch.float32
        )
        partial_lse = query.new_empty((query.shape[0], num_heads, splits), dtype=torch.float32)
    else:
        partial_out, partial_lse = out, out  # unused: the kernel writes `out` directly
    grid = (num_reqs, num_head_groups, triton.cdiv(max_query_len, block_q) * splits)
    _mla_attention_kernel[grid](
        partial_out,
        partial_lse,
        query,
        kv_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale * _LOG2E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        block_table.stride(0),
        NUM_SPLITS=splits,
        NUM_HEADS=num_heads,
        BLOCK_H=block_h,
        KV_LORA_RANK=kv_lora_rank,
        LORA_P=lora_p,
        ROPE_DIM=rope_dim,
        ROPE_P=max(16, triton.next_power_of_2(rope_dim)),
        KV_BLOCK_SIZE=kv_cache.shape[1],
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION="ieee" if fp32 else "tf32",
        num_warps=4 if block_m <= 16 else 8,
        num_stages=2,
    )
    if splits > 1:
        _mla_merge_splits_kernel[(query.shape[0], num_heads)](
            out,
            partial_out,
            partial_lse,
            query_start_loc,
            num_reqs,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            NUM_SPLITS=splits,
            SPLIT_CHUNK=min(splits, 16),
            KV_LORA_RANK=kv_lora_rank,
            LORA_P=lora_p,
        )
    return out


def _splits(
    num_kv_splits: int | None,
    max_query_len: int,
    num_reqs: int,
    num_head_groups: int,
    device: torch.device,
) -> int:
    if num_kv_splits is None:
        return num_kv_splits_for(num_reqs, num_head_groups, device) if max_query_len == 1 else 1
    if num_kv_splits < 1 or num_kv_splits > MAX_KV_SPLITS or num_kv_splits & (num_kv_splits - 1):
        raise ValueError(
            f"num_kv_splits must be a power of two in [1, {MAX_KV_SPLITS}], got {num_kv_splits}"
        )
    if num_kv_splits > 1 and max_query_len != 1:
        raise ValueError(
            f"num_kv_splits={num_kv_splits} splits decode batches only "
            f"(max_query_len {max_query_len})"
        )
    return num_kv_splits


def mla_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, kv_lora_rank + rope_dim]
    kv_cache: torch.Tensor,  # [num_blocks, block_size, kv_lora_rank + rope_dim]
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks_per_req] int32
    max_query_len: int,  # unused; kept so both functions take the same arguments
    scale: float,
    kv_lora_rank: int,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, kv_lora_rank], written in place
    num_kv_splits: int | None = None,  # unused: the reference attends to all keys at once
) -> torch.Tensor:  # [num_tokens, num_heads, kv_lora_rank], query's dtype
    """Torch reference of :func:`mla_attention` (what CPU runs use): one request at a time, its
    latent rows gathered from their blocks, softmax in float32. Reads lengths to the host.

    Raises:
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    del max_query_len, num_kv_splits
    out = _check_mla(query, kv_cache, query_start_loc, seq_lens, block_table, kv_lora_rank, out)
    block_size = kv_cache.shape[1]
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        if q_end == q_start:
            continue
        blocks = block_table[i, : -(-seq_len // block_size)].long()
        latent = kv_cache[blocks].flatten(0, 1)[:seq_len].float()  # [seq_len, rank + rope]
        scores = torch.einsum("qhd,kd->hqk", query[q_start:q_end].float(), latent) * scale
        q_pos = torch.arange(seq_len - (q_end - q_start), seq_len, device=query.device)[:, None]
        allowed = torch.arange(seq_len, device=query.device)[None, :] <= q_pos
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,kc->qhc", probs, latent[:, :kv_lora_rank]).to(
            out.dtype
        )
    return out


def _check_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    kv_lora_rank: int,
    out: torch.Tensor | None,
) -> torch.Tensor:
    if query.dim() != 3 or kv_cache.dim() != 3 or query.shape[2] != kv_cache.shape[2]:
        raise ValueError(
            f"query must be [T, H, rank + rope] and kv_cache [blocks, block_size, "
            f"rank + rope], got {tuple(query.shape)} and {tuple(kv_cache.shape)}"
        )
    if not 0 < kv_lora_rank < query.shape[2]:
        raise ValueError(
            f"kv_lora_rank ({kv_lora_rank}) must leave a rotary part in the "
            f"{query.shape[2]}-wide rows"
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
    if query.stride(2) != 1 or kv_cache.stride(2) != 1 or block_table.stride(1) != 1:
        raise ValueError("query, kv_cache and block_table need a unit stride in the last dim")
    shape = (query.shape[0], query.shape[1], kv_lora_rank)
    if out is None:
        return query.new_zeros(shape)
    if tuple(out.shape) != shape or out.dtype != query.dtype or out.stride(2) != 1:
        raise ValueError(
            f"out must be {shape} {query.dtype} with unit last stride, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    return out


__all__ = [
    "MAX_KV_SPLITS",
    "mla_attention",
    "mla_attention_ref",
    "mla_tiles",
    "num_kv_splits_for",
]
