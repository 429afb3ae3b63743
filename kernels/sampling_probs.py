"""The distribution a request samples from, written out: ``softmax`` of its processed logits
over the tokens min-p, top-k and top-p keep (docs/sampling.md steps 3-8), zero elsewhere.

Speculative decoding's rejection rule (``kernels/rejection_sample.py``) needs the target's and
the draft's probabilities of a draft token, and the residual ``max(p - q, 0)`` over the whole
vocabulary, so both distributions are materialised here, ``[num_rows, vocab_size]`` float32
per step (vLLM's ``target_probs`` / ``draft_probs``). The processing is
``kernels/gumbel_sample.py``'s own helpers (``_processed_logits``, ``_kept_threshold``): the
Gumbel-max draw of that kernel samples exactly from the distribution written here.

Greedy rows (temperature 0) are not written: they verify drafts by argmax, never by
probability.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat, check_matrix
from turnout.kernels._select import _float_key, vocab_block_size
from turnout.kernels._triton import require_triton, tl, triton
from turnout.kernels.gumbel_sample import (
    SamplingTables,
    _apply_penalties_ref,
    _kept_threshold,
    _min_p_ref,
    _processed_logits,
    _top_k_ref,
    _top_p_ref,
)


@triton.jit  # type: ignore[untyped-decorator]
def _compute_probs_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    positions_ptr,
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
    stop_ptr,
    stop_stride,
    counts_ptr,
    counts_stride,
    probs_ptr,
    probs_stride,
    vocab_size,
    HAS_COUNTS: tl.constexpr,
    MAX_STOP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    p = row * params_stride
    temperature = tl.load(temperature_ptr + p)
    if temperature != 0.0:  # greedy rows are left unwritten (never read)
        rep = tl.load(rep_ptr + p)
        freq = tl.load(freq_ptr + p)
        pres = tl.load(pres_ptr + p)
        pos = tl.load(positions_ptr + i)
        mask_stop = (pos - tl.load(num_prompt_ptr + p)) < tl.load(min_tokens_ptr + p)
        logits_row = logits_ptr + i.to(tl.int64) * logits_stride
        counts_row = counts_ptr + i.to(tl.int64) * counts_stride
        stop_row = stop_ptr + row * stop_stride
        probs_row = probs_ptr + i.to(tl.int64) * probs_stride
        threshold = _kept_threshold(
            logits_row,
            counts_row,
            stop_row,
            rep,
            freq,
            pres,
            mask_stop,
            temperature,
            tl.load(top_k_ptr + p),
            tl.load(top_p_ptr + p),
            tl.load(min_p_ptr + p),
            vocab_size,
            HAS_COUNTS,
            MAX_STOP,
            BLOCK_SIZE,
        )
        offs = tl.arange(0, BLOCK_SIZE)
        m = tl.full([], float("-inf"), tl.float32)
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
            x = tl.where(mask & (_float_key(x) >= threshold), x, float("-inf"))
            m = tl.maximum(m, tl.max(x, axis=0))
        z = tl.full([], 0.0, tl.float32)
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
            kept = mask & (_float_key(x) >= threshold)
            z += tl.sum(tl.where(kept, tl.exp(x - m), 0.0), axis=0)
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
            kept = mask & (_float_key(x) >= threshold)
            tl.store(
                probs_row + tok, tl.where(kept, tl.math.div_rn(tl.exp(x - m), z), 0.0), mask=mask
            )


def compute_probs(
    logits: torch.Tensor,  # [num_rows, vocab_size] float32, raw (not modified)
    idx_mapping: torch.Tensor,  # [num_rows] int32, table row of each logits row
    positions: torch.Tensor,  # [>= num_rows] int32: position of the token each row samples
    tables: SamplingTables,
    counts: torch.Tensor | None,  # [num_rows, vocab_size] int32 from build_penalty_counts
    probs_out: torch.Tensor,  # [num_rows, vocab_size] float32, written (greedy rows: not)
) -> None:
    """Write each sampled row's processed distribution (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations.
    """
    require_triton()
    params_stride = _check(logits, idx_mapping, positions, tables, counts, probs_out)
    num_rows, vocab_size = logits.shape
    if num_rows == 0:
        return
    counts_arg = counts if counts is not None else logits  # never read without HAS_COUNTS
    _compute_probs_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        idx_mapping,
        positions,
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
        tables.stop_token_ids,
        tables.stop_token_ids.stride(0),
        counts_arg,
        counts_arg.stride(0),
        probs_out,
        probs_out.stride(0),
        vocab_size,
        HAS_COUNTS=counts is not None,
        MAX_STOP=tables.stop_token_ids.shape[1],
        BLOCK_SIZE=vocab_block_size(vocab_size, logits.device),
        enable_fp_fusion=False,
    )


def compute_probs_ref(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    positions: torch.Tensor,
    tables: SamplingTables,
    counts: torch.Tensor | None,
    probs_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`compute_probs` (same arguments; one row at a time, min-p by
    softmax, top-k and top-p by sorting, as ``gumbel_sample_ref``)."""
    _check(logits, idx_mapping, positions, tables, counts, probs_out)
    for i, row in enumerate(idx_mapping.tolist()):
        temperature = float(tables.temperature[row])
        if temperature == 0.0:
            continue
        x = logits[i].clone()
        if counts is not None:
            x = _apply_penalties_ref(x, counts[i], tables, row)
        if int(positions[i]) - int(tables.num_prompt_tokens[row]) < int(tables.min_tokens[row]):
            stop = tables.stop_token_ids[row]
            x[stop[stop >= 0].long()] = float("-inf")
        x = _min_p_ref(x / tables.temperature[row], float(tables.min_p[row]))
        x = _top_p_ref(_top_k_ref(x, int(tables.top_k[row])), float(tables.top_p[row]))
        probs_out[i] = torch.softmax(x, dim=0)


def _check(
    logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    positions: torch.Tensor,
    tables: SamplingTables,
    counts: torch.Tensor | None,
    probs_out: torch.Tensor,
) -> int:
    params_stride = tables.check()
    check_matrix("logits", logits, torch.float32, "[num_rows, vocab_size]")
    check_matrix(
        "probs_out",
        probs_out,
        torch.float32,
        "[num_rows, vocab_size] (the shape of logits)",
        *logits.shape,
    )
    check_dtypes(idx_mapping=(idx_mapping, torch.int32), positions=(positions, torch.int32))
    check_flat(idx_mapping=idx_mapping, positions=positions)
    check_at_least(logits.shape[0], "num_rows", idx_mapping=idx_mapping, positions=positions)
    if counts is not None:
        check_matrix(
            "counts",
            counts,
            torch.int32,
            "[num_rows, vocab_size] (the shape of logits)",
            *logits.shape,
        )
    return params_stride


__all__ = ["compute_probs", "compute_probs_ref"]
