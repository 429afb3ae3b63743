"""Gumbel-max sampling over the request table, following docs/sampling.md steps 3-9.

Programs per request of the batch (table row ``idx_mapping[i]``; one, or one per vocabulary
slice, see :func:`gumbel_sample`) walk its logits row in blocks, applying on the fly and in
this order: penalties (from the counts of ``kernels/penalties.py``), the ``min_tokens`` mask,
then either greedy argmax (temperature 0) or temperature, min-p, top-k, top-p and the draw
``argmax(x + g)`` with the stateless noise of ``kernels/gumbel_noise.py`` (``g`` from
``(seed, position, token_id)``, so V2's samples equal V1's). The raw logits are never written:
logprobs are taken from them afterwards.

Each filter keeps the tokens at or above an order key, so the three make one threshold. min-p's
is the lowest key it keeps (one pass after the row's maximum); top-k and top-p thresholds come
from radix selection (``kernels/_select.py``): no sort, no ``[num_reqs, vocab_size]`` scratch.
Divisions use ``div_rn`` and FP contraction is off, so every value equals torch's float32
arithmetic in :func:`gumbel_sample_ref` (min-p's ``exp`` aside: docs/sampling.md, the limits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnout.kernels._checks import (
    check_at_least,
    check_dtypes,
    check_flat,
    check_matrix,
    check_table,
    shared_stride,
)
from turnout.kernels._select import (
    _argmax_update,
    _float_key,
    _radix_advance,
    _radix_candidates,
    vocab_block_size,
)
from turnout.kernels._triton import require_triton, tl, triton
from turnout.kernels.gumbel_noise import _gumbel_from_hash, _row_hash, gumbel_noise_ref
from turnout.kernels.penalties import COUNT_MASK

_GREEDY_TEMPERATURE = 0.0  # rows with temperature < 1e-5 are stored as exactly 0 (greedy)


@dataclass(frozen=True)
class SamplingTables:
    """Per-row sampling parameters of the request table (views; ``[max_num_seqs]`` each).

    The float32/int32 columns share one stride (a packed table); ``seed`` is int64 with its
    own stride; ``stop_token_ids`` is ``[max_num_seqs, max_stop_token_ids]`` int32 holding, for
    ``min_tokens``, the ids to mask (EOS unless ignore_eos, then the stop ids), ``-1`` padded.
    ``temperature`` is 0 for greedy rows.
    """

    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int32, <= 0 keeps all
    top_p: torch.Tensor  # float32
    min_p: torch.Tensor  # float32, 0 keeps all
    repetition_penalty: torch.Tensor  # float32
    frequency_penalty: torch.Tensor  # float32
    presence_penalty: torch.Tensor  # float32
    min_tokens: torch.Tensor  # int32
    num_prompt_tokens: torch.Tensor  # int32
    seed: torch.Tensor  # int64
    stop_token_ids: torch.Tensor  # [max_num_seqs, max_stop] int32

    def check(self) -> int:
        """Check dtypes and strides; return the shared stride of the 32-bit columns.

        Raises:
            ValueError: a dtype or stride differs from the annotations.
        """
        cols32 = {
            "temperature": torch.float32,
            "top_k": torch.int32,
            "top_p": torch.float32,
            "min_p": torch.float32,
            "repetition_penalty": torch.float32,
            "frequency_penalty": torch.float32,
            "presence_penalty": torch.float32,
            "min_tokens": torch.int32,
            "num_prompt_tokens": torch.int32,
        }
        check_dtypes(**{name: (getattr(self, name), dtype) for name, dtype in cols32.items()})
        stride = shared_stride(
            "the 32-bit parameter columns", *(getattr(self, name) for name in cols32)
        )
        check_dtypes(
            seed=(self.seed, torch.int64), stop_token_ids=(self.stop_token_ids, torch.int32)
        )
        check_table("stop_token_ids", self.stop_token_ids)
        return stride


@triton.jit  # type: ignore[untyped-decorator]
def _processed_logits(  # type: ignore[no-untyped-def]
    logits_row,
    counts_row,
    stop_row,
    tok,
    mask,
    rep,
    freq,
    pres,
    mask_stop,
    temperature,
    HAS_COUNTS: tl.constexpr,
    MAX_STOP: tl.constexpr,
    SCALE: tl.constexpr,
):
    # docs/sampling.md steps 3 (penalties), 4 (min_tokens) and 6 (temperature) on one block.
    x = tl.load(logits_row + tok, mask=mask, other=float("-inf"))
    if HAS_COUNTS:
        c = tl.load(counts_row + tok, mask=mask, other=0)
        count = c & 0xFFFFFF
        penalised = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep)
        x = tl.where(c != 0, penalised, x)
        x = x - freq * count.to(tl.float32)
        x = x - pres * (count > 0).to(tl.float32)
    if mask_stop:
        for s in range(MAX_STOP):
            x = tl.where(tok == tl.load(stop_row + s), float("-inf"), x)
    if SCALE:
        x = tl.math.div_rn(x, temperature)
    return x


@triton.jit  # type: ignore[untyped-decorator]
def _kept_threshold(  # type: ignore[no-untyped-def]
    logits_row,
    counts_row,
    stop_row,
    rep,
    freq,
    pres,
    mask_stop,
    temperature,
    top_k,
    top_p,
    min_p,
    vocab_size,
    HAS_COUNTS: tl.constexpr,
    MAX_STOP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # docs/sampling.md steps 6 (min-p), 7 (top-k) and 8 (top-p) on the processed logits of one
    # row: the order key at or above which a token is kept (0 keeps all). Shared with the
    # processed probabilities of kernels/sampling_probs.py, so that both keep the same tokens.
    offs = tl.arange(0, BLOCK_SIZE)
    threshold = tl.full([], 0, tl.int64)  # keys >= threshold are kept; 0 keeps all
    m = tl.full([], float("-inf"), tl.float32)  # the row's largest logit (min-p and top-p)
    if (min_p > 0.0) | (top_p < 1.0):
        for start in range(0, vocab_size, BLOCK_SIZE):
            tok = start + offs
            x = _processed_logits(
                logits_row,
                counts_row,
                stop_row,
                tok,
                tok < vocab_size,
                rep,
                freq,
                pres,
                mask_stop,
                temperature,
                HAS_COUNTS,
                MAX_STOP,
                True,
            )
            m = tl.maximum(m, tl.max(x, axis=0))
    if min_p > 0.0:
        # vLLM drops p < min_p * p_max (vllm/v1/sample/logits_processor/builtin.py); with
        # p = exp(x - m) / Z and p_max = 1 / Z that is exp(x - m) < min_p, without Z. The
        # maximum always stays (x == m, whatever exp rounds to). The kept set is every key
        # from the lowest kept one up, so top-k and top-p below start from it.
        lowest = tl.full([], 1 << 33, tl.int64)  # above every key
        for start in range(0, vocab_size, BLOCK_SIZE):
            tok = start + offs
            mask = tok < vocab_size
            x = _processed_logits(
                logits_row,
                counts_row,
                stop_row,
                tok,
                mask,
                rep,
                freq,
                pres,
                mask_stop,
                temperature,
                HAS_COUNTS,
                MAX_STOP,
                True,
            )
            ok = mask & ((x == m) | (tl.exp(x - m) >= min_p))
            lowest = tl.minimum(lowest, tl.min(tl.where(ok, _float_key(x), 1 << 33), axis=0))
        threshold = lowest
    if (top_k > 0) & (top_k < vocab_size):
        # The k-th largest key of the whole row. min-p only drops a tail below the keys it
        # keeps, so top-k of what min-p left is the larger of the two thresholds (all of it
        # when fewer than k are left).
        kth = tl.full([], 0, tl.int64)
        for r in range(8):
            cand, shift = _radix_candidates(kth, r)
            num_ge = tl.zeros([16], tl.int32)
            for start in range(0, vocab_size, BLOCK_SIZE):
                tok = start + offs
                mask = tok < vocab_size
                x = _processed_logits(
                    logits_row,
                    counts_row,
                    stop_row,
                    tok,
                    mask,
                    rep,
                    freq,
                    pres,
                    mask_stop,
                    temperature,
                    HAS_COUNTS,
                    MAX_STOP,
                    True,
                )
                ge = (_float_key(x)[:, None] >= cand[None, :]) & mask[:, None]
                num_ge += tl.sum(ge.to(tl.int32), axis=0)
            kth = _radix_advance(kth, shift, num_ge >= top_k)
        threshold = tl.maximum(threshold, kth)
    if top_p < 1.0:
        kept_from = threshold
        target = tl.full([], 0.0, tl.float32)
        for r in range(8):
            cand, shift = _radix_candidates(threshold, r)
            mass = tl.zeros([16], tl.float32)
            for start in range(0, vocab_size, BLOCK_SIZE):
                tok = start + offs
                mask = tok < vocab_size
                x = _processed_logits(
                    logits_row,
                    counts_row,
                    stop_row,
                    tok,
                    mask,
                    rep,
                    freq,
                    pres,
                    mask_stop,
                    temperature,
                    HAS_COUNTS,
                    MAX_STOP,
                    True,
                )
                key = _float_key(x)
                e = tl.where(mask & (key >= kept_from), tl.exp(x - m), 0.0)
                mass += tl.sum(tl.where(key[:, None] >= cand[None, :], e[:, None], 0.0), axis=0)
            if r == 0:
                # Candidate 0 of pass 0 is the threshold kept so far: its mass is Z.
                target = top_p * tl.max(tl.where(tl.arange(0, 16) == 0, mass, 0.0), axis=0)
            threshold = _radix_advance(threshold, shift, mass >= target)
    return threshold


@triton.jit(  # type: ignore[untyped-decorator]
    do_not_specialize=["split_len", "num_splits"]
)  # one variant whatever the split (see kernels/positions.py)
def _gumbel_sample_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    seq_lens_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    min_tokens_ptr,
    num_prompt_ptr,
    params_stride,
    seed_ptr,
    seed_stride,
    stop_ptr,
    stop_stride,
    counts_ptr,
    counts_stride,
    sampled_ptr,
    partial_val_ptr,
    partial_idx_ptr,
    vocab_size,
    split_len,
    num_splits,
    HAS_COUNTS: tl.constexpr,
    MAX_STOP: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # Grid (num_reqs, num_splits). A row without min-p/top-k/top-p (greedy or plain
    # temperature) is split over the vocabulary: program (i, s) takes the argmax of its slice of
    # split_len ids and _gumbel_reduce_kernel picks among the slices. A row with min-p, top-k or
    # top-p needs its whole row for the threshold, so split 0 does all of it and the other
    # splits nothing.
    i = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    p = row * params_stride
    temperature = tl.load(temperature_ptr + p)
    top_k = tl.load(top_k_ptr + p)
    top_p = tl.load(top_p_ptr + p)
    min_p = tl.load(min_p_ptr + p)
    rep = tl.load(rep_ptr + p)
    freq = tl.load(freq_ptr + p)
    pres = tl.load(pres_ptr + p)
    pos = tl.load(seq_lens_ptr + i)  # position of the token being sampled
    mask_stop = (pos - tl.load(num_prompt_ptr + p)) < tl.load(min_tokens_ptr + p)
    logits_row = logits_ptr + i.to(tl.int64) * logits_stride
    counts_row = counts_ptr + i.to(tl.int64) * counts_stride
    stop_row = stop_ptr + row * stop_stride
    offs = tl.arange(0, BLOCK_SIZE)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    filtered = (temperature != 0.0) & (
        ((top_k > 0) & (top_k < vocab_size)) | (top_p < 1.0) | (min_p > 0.0)
    )
    lo = tl.where(filtered, tl.where(split == 0, 0, vocab_size), split * split_len)
    hi = tl.where(filtered, vocab_size, tl.minimum(vocab_size, split * split_len + split_len))
    if temperature == 0.0:
        for start in range(lo, hi, BLOCK_SIZE):
            tok = start + offs
            x = _processed_logits(
                logits_row,
                counts_row,
                stop_row,
                tok,
                tok < vocab_size,
                rep,
                freq,
                pres,
                mask_stop,
                temperature,
                HAS_COUNTS,
                MAX_STOP,
                False,
            )
            best_val, best_idx = _argmax_update(x, tok, best_val, best_idx)
    else:
        threshold = tl.full([], 0, tl.int64)  # keys >= threshold are kept; 0 keeps all
        if split == 0:  # a row with min-p/top-k/top-p is sampled whole by split 0 alone
            threshold = _kept_threshold(
                logits_row,
                counts_row,
                stop_row,
                rep,
                freq,
                pres,
                mask_stop,
                temperature,
                top_k,
                top_p,
                min_p,
                vocab_size,
                HAS_COUNTS,
                MAX_STOP,
                BLOCK_SIZE,
            )
        row_h = _row_hash(tl.load(seed_ptr + row * seed_stride), pos.to(tl.int64))
        for start in range(lo, hi, BLOCK_SIZE):
            tok = start + offs
            mask = tok < hi
            x = _processed_logits(
                logits_row,
                counts_row,
                stop_row,
                tok,
                mask,
                rep,
                freq,
                pres,
                mask_stop,
                temperature,
                HAS_COUNTS,
                MAX_STOP,
                True,
            )
            kept = mask & (_float_key(x) >= threshold)
            v = tl.where(kept, x + _gumbel_from_hash(row_h, tok), float("-inf"))
            best_val, best_idx = _argmax_update(v, tok, best_val, best_idx)
    if SPLIT:
        tl.store(partial_val_ptr + i * num_splits + split, best_val)
        tl.store(partial_idx_ptr + i * num_splits + split, best_idx)
    else:
        tl.store(sampled_ptr + i, best_idx)


@triton.jit(  # type: ignore[untyped-decorator]
    do_not_specialize=["num_splits"]
)  # one variant whatever the split (see kernels/positions.py)
def _gumbel_reduce_kernel(  # type: ignore[no-untyped-def]
    partial_val_ptr, partial_idx_ptr, sampled_ptr, num_splits, BLOCK_SIZE: tl.constexpr
):
    # One program per request: the best of its slices; ties go to the lowest token id, as in
    # the unsplit kernel (a slice's partial is the lowest id of its own maximum).
    i = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < num_splits
    val = tl.load(partial_val_ptr + i * num_splits + offs, mask=mask, other=float("-inf"))
    idx = tl.load(partial_idx_ptr + i * num_splits + offs, mask=mask, other=2147483647)
    best = tl.max(val, axis=0)
    tl.store(sampled_ptr + i, tl.min(tl.where(mask & (val == best), idx, 2147483647), axis=0))


def gumbel_sample(
    logits: torch.Tensor,  # [num_reqs, vocab_size] float32, raw (not modified)
    idx_mapping: torch.Tensor,  # [num_reqs] int32, batch position -> table row
    seq_lens: torch.Tensor,  # [>= num_reqs] int32: position of the token sampled per request
    tables: SamplingTables,
    counts: torch.Tensor | None,  # [num_reqs, vocab_size] int32 from build_penalty_counts
    sampled_out: torch.Tensor,  # [>= num_reqs] int32, written in place
    num_splits: int | None = None,  # vocabulary slices per request; None: sample_splits()
) -> None:
    """Sample one token per request (docs/sampling.md steps 3-9) (Triton).

    ``counts=None`` when no request of the batch has penalties (skips that code entirely).
    Rows without min-p/top-k/top-p are split over the vocabulary (flash-decoding's split and second
    reduction, Dao et al. 2023, applied to the argmax), so one step's sampling at 256 requests
    of a 151,936-id vocabulary runs about 2,000 programs instead of 256; the sample is the same
    whatever the split (the noise depends only on seed, position and token id).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations, or num_splits < 1.
    """
    require_triton()
    params_stride = _check(logits, idx_mapping, seq_lens, tables, counts, sampled_out)
    num_reqs, vocab_size = logits.shape
    if num_reqs == 0:
        return
    counts_arg = counts if counts is not None else logits  # never read without HAS_COUNTS
    block = vocab_block_size(vocab_size, logits.device)
    splits = num_splits if num_splits is not None else sample_splits(num_reqs, vocab_size, block)
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {splits}")
    split_len = triton.cdiv(triton.cdiv(vocab_size, splits), block) * block
    splits = triton.cdiv(vocab_size, split_len)  # no empty slice
    partial_val = torch.empty((num_reqs, splits), dtype=torch.float32, device=logits.device)
    partial_idx = torch.empty((num_reqs, splits), dtype=torch.int32, device=logits.device)
    _gumbel_sample_kernel[(num_reqs, splits)](
        logits,
        logits.stride(0),
        idx_mapping,
        seq_lens,
        tables.temperature,
        tables.top_k,
        tables.top_p,
        tables.min_p,
        tables.repetition_penalty,
        tables.frequency_penalty,
        tables.presence_penalty,
        tables.min_tokens,
        tables.num_prompt_tokens,
        params_stride,
        tables.seed,
        tables.seed.stride(0),
        tables.stop_token_ids,
        tables.stop_token_ids.stride(0),
        counts_arg,
        counts_arg.stride(0),
        sampled_out,
        partial_val,
        partial_idx,
        vocab_size,
        split_len,
        splits,
        HAS_COUNTS=counts is not None,
        MAX_STOP=tables.stop_token_ids.shape[1],
        SPLIT=splits > 1,
        BLOCK_SIZE=block,
        enable_fp_fusion=False,
    )
    if splits > 1:
        _gumbel_reduce_kernel[(num_reqs,)](
            partial_val, partial_idx, sampled_out, splits, BLOCK_SIZE=triton.next_power_of_2(splits)
        )


#: Programs the split sampler aims for on a GPU (an H200 has 132 SMs: ~16 programs each).
TARGET_PROGRAMS = 2048
#: Fewest blocks of the vocabulary per slice: below that the second pass is not worth it.
MIN_SLICE_BLOCKS = 8


def sample_splits(num_reqs: int, vocab_size: int, block: int) -> int:
    """Slices of the vocabulary per request: enough programs to fill the GPU
    (``TARGET_PROGRAMS``), each slice at least ``MIN_SLICE_BLOCKS`` blocks (256 requests of
    Qwen3's 151,936 ids: 8 slices of 19 blocks of 1,024)."""
    by_work: int = triton.cdiv(TARGET_PROGRAMS, max(num_reqs, 1))
    by_size = max(1, vocab_size // (MIN_SLICE_BLOCKS * block))
    return max(1, min(by_work, by_size))


def gumbel_sample_ref(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    tables: SamplingTables,
    counts: torch.Tensor | None,
    sampled_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`gumbel_sample` (same arguments; sorts, one row at a time)."""
    _check(logits, idx_mapping, seq_lens, tables, counts, sampled_out)
    for i, row in enumerate(idx_mapping.tolist()):
        x = logits[i].clone()
        if counts is not None:
            x = _apply_penalties_ref(x, counts[i], tables, row)
        pos = int(seq_lens[i])
        if pos - int(tables.num_prompt_tokens[row]) < int(tables.min_tokens[row]):
            stop = tables.stop_token_ids[row]
            x[stop[stop >= 0].long()] = float("-inf")
        temperature = tables.temperature[row]
        if float(temperature) == _GREEDY_TEMPERATURE:
            sampled_out[i] = int(torch.argmax(x))  # first maximum: the lowest id
            continue
        x = x / temperature
        x = _min_p_ref(x, float(tables.min_p[row]))
        x = _top_k_ref(x, int(tables.top_k[row]))
        x = _top_p_ref(x, float(tables.top_p[row]))
        seed = tables.seed[row : row + 1]
        g = gumbel_noise_ref(
            seed, torch.tensor([pos], dtype=torch.int64, device=x.device), x.shape[0]
        )[0]
        sampled_out[i] = int(torch.argmax(x + g))


def _apply_penalties_ref(
    x: torch.Tensor, c: torch.Tensor, tables: SamplingTables, row: int
) -> torch.Tensor:
    count = (c & COUNT_MASK).to(torch.float32)
    rep = tables.repetition_penalty[row]
    x = torch.where(c != 0, torch.where(x > 0, x / rep, x * rep), x)
    x = x - tables.frequency_penalty[row] * count
    return x - tables.presence_penalty[row] * (count > 0).to(torch.float32)


def _min_p_ref(x: torch.Tensor, min_p: float) -> torch.Tensor:
    # docs/sampling.md step 6: vLLM's MinPLogitsProcessor.apply
    # (vllm/v1/sample/logits_processor/builtin.py), after temperature, before top-k and top-p:
    # a token whose probability is below min_p times the largest gets -inf.
    if min_p <= 0.0:
        return x
    probs = torch.softmax(x, dim=0)
    return x.masked_fill(probs < min_p * probs.max(), float("-inf"))


def _top_k_ref(x: torch.Tensor, k: int) -> torch.Tensor:
    # docs/sampling.md step 7: keep every token at least as large as the k-th largest.
    if k <= 0 or k >= x.shape[0]:
        return x
    kth = torch.topk(x, k).values[-1]
    return x.masked_fill(x < kth, float("-inf"))


def _top_p_ref(x: torch.Tensor, top_p: float) -> torch.Tensor:
    # docs/sampling.md step 8: the most likely tokens until their mass reaches top_p, plus ties.
    if top_p >= 1.0:
        return x
    probs = torch.softmax(x, dim=0)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    cum = torch.cumsum(sorted_probs, dim=0)
    cut = int(torch.searchsorted(cum, torch.tensor([top_p], dtype=cum.dtype, device=cum.device)))
    cut = min(cut, x.shape[0] - 1)
    threshold = x[order[cut]]
    return x.masked_fill(x < threshold, float("-inf"))


def _check(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    tables: SamplingTables,
    counts: torch.Tensor | None,
    sampled_out: torch.Tensor,
) -> int:
    params_stride = tables.check()
    check_matrix("logits", logits, torch.float32, "[num_reqs, vocab_size]")
    i32 = torch.int32
    check_dtypes(
        idx_mapping=(idx_mapping, i32), seq_lens=(seq_lens, i32), sampled_out=(sampled_out, i32)
    )
    check_flat(idx_mapping=idx_mapping, seq_lens=seq_lens, sampled_out=sampled_out)
    check_at_least(
        logits.shape[0],
        "num_reqs",
        idx_mapping=idx_mapping,
        seq_lens=seq_lens,
        sampled_out=sampled_out,
    )
    if counts is not None:
        check_matrix(
            "counts", counts, i32, "[num_reqs, vocab_size] (the shape of logits)", *logits.shape
        )
    return params_stride


__all__ = ["SamplingTables", "gumbel_sample", "gumbel_sample_ref", "sample_splits"]
