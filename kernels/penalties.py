"""Penalty counts: which tokens a request has seen, built per step on the device.

For each request of the batch that uses a penalty (repetition != 1, frequency != 0 or
presence != 0), one program scans its tokens in the device table and records, per vocabulary
id, the number of occurrences in the *output* (low 24 bits) and whether it occurs in the
*prompt* (bit 24). The sampler (``kernels/gumbel_sample.py``) reads these words to apply vLLM's
penalties (docs/sampling.md step 3) on the fly, so the raw logits stay untouched for logprobs.

The buffer is ``[num_reqs, vocab_size]``: sized by the step's batch like the logits themselves,
not ``[max_num_seqs, vocab_size]`` state carried between steps. A request resumed after
preemption holds its earlier output in its token list; the prompt/output split is by
``num_prompt_tokens``, so its counts are the same as before the preemption.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import (
    check_at_least,
    check_dtypes,
    check_flat,
    check_matrix,
    check_table,
    shared_stride,
)
from turnout.kernels._triton import require_triton, tl, triton

#: Bit of a counts word that marks a token present in the prompt.
PROMPT_BIT = 1 << 24
#: Mask of the output-occurrence count in a counts word.
COUNT_MASK = PROMPT_BIT - 1


@triton.jit  # type: ignore[untyped-decorator]
def _build_penalty_counts_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    seq_lens_ptr,
    token_ids_ptr,
    token_ids_stride,
    num_prompt_tokens_ptr,
    repetition_penalty_ptr,
    frequency_penalty_ptr,
    presence_penalty_ptr,
    params_stride,
    counts_ptr,
    counts_stride,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    rep = tl.load(repetition_penalty_ptr + row * params_stride)
    freq = tl.load(frequency_penalty_ptr + row * params_stride)
    pres = tl.load(presence_penalty_ptr + row * params_stride)
    # Rows without penalties keep zero counts (the sampler then leaves their logits as they are).
    if (rep != 1.0) | (freq != 0.0) | (pres != 0.0):
        num_prompt = tl.load(num_prompt_tokens_ptr + row * params_stride)
        seq_len = tl.load(seq_lens_ptr + i)
        offs = tl.arange(0, BLOCK_SIZE)
        tokens_row = token_ids_ptr + row * token_ids_stride
        counts_row = counts_ptr + i.to(tl.int64) * counts_stride
        # Atomics: a token may repeat inside one block.
        for start in range(0, num_prompt, BLOCK_SIZE):
            idx = start + offs
            mask = idx < num_prompt
            tok = tl.load(tokens_row + idx, mask=mask, other=0)
            tl.atomic_or(counts_row + tok, tl.full([BLOCK_SIZE], 1 << 24, tl.int32), mask=mask)
        for start in range(num_prompt, seq_len, BLOCK_SIZE):
            idx = start + offs
            mask = idx < seq_len
            tok = tl.load(tokens_row + idx, mask=mask, other=0)
            tl.atomic_add(counts_row + tok, tl.full([BLOCK_SIZE], 1, tl.int32), mask=mask)


def build_penalty_counts(
    idx_mapping: torch.Tensor,  # [num_reqs] int32, batch position -> table row
    seq_lens: torch.Tensor,  # [>= num_reqs] int32, position of the token sampled this step
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32
    num_prompt_tokens: torch.Tensor,  # [max_num_seqs] int32 (stride = params stride)
    repetition_penalty: torch.Tensor,  # [max_num_seqs] float32 (same stride)
    frequency_penalty: torch.Tensor,  # [max_num_seqs] float32 (same stride)
    presence_penalty: torch.Tensor,  # [max_num_seqs] float32 (same stride)
    counts_out: torch.Tensor,  # [num_reqs, vocab_size] int32, zeroed by the caller
) -> None:
    """Record output counts and prompt presence of each penalised request (Triton).

    The output tokens of request ``i`` are ``token_ids[row, num_prompt_tokens:seq_lens[i]]``:
    everything before the token being sampled.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations.
    """
    require_triton()
    stride = _check(
        idx_mapping,
        seq_lens,
        token_ids,
        num_prompt_tokens,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        counts_out,
    )
    num_reqs = idx_mapping.shape[0]
    if num_reqs == 0:
        return
    _build_penalty_counts_kernel[(num_reqs,)](
        idx_mapping,
        seq_lens,
        token_ids,
        token_ids.stride(0),
        num_prompt_tokens,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        stride,
        counts_out,
        counts_out.stride(0),
        BLOCK_SIZE=256,
    )


def build_penalty_counts_ref(
    idx_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    token_ids: torch.Tensor,
    num_prompt_tokens: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
    counts_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`build_penalty_counts` (same arguments)."""
    _check(
        idx_mapping,
        seq_lens,
        token_ids,
        num_prompt_tokens,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        counts_out,
    )
    vocab_size = counts_out.shape[1]
    for i, row in enumerate(idx_mapping.tolist()):
        if (
            (repetition_penalty[row] == 1)
            & (frequency_penalty[row] == 0)
            & (presence_penalty[row] == 0)
        ):
            continue
        n_prompt, seq_len = int(num_prompt_tokens[row]), int(seq_lens[i])
        prompt = token_ids[row, :n_prompt].long()
        output = token_ids[row, n_prompt:seq_len].long()
        counts = torch.bincount(output, minlength=vocab_size).to(torch.int32)
        in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=counts.device)
        in_prompt[prompt] = True
        counts_out[i] = counts | (in_prompt.to(torch.int32) * PROMPT_BIT)


def _check(
    idx_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    token_ids: torch.Tensor,
    num_prompt_tokens: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
    counts_out: torch.Tensor,
) -> int:
    i32, f32 = torch.int32, torch.float32
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        seq_lens=(seq_lens, i32),
        token_ids=(token_ids, i32),
        num_prompt_tokens=(num_prompt_tokens, i32),
        repetition_penalty=(repetition_penalty, f32),
        frequency_penalty=(frequency_penalty, f32),
        presence_penalty=(presence_penalty, f32),
        counts_out=(counts_out, i32),
    )
    check_flat(idx_mapping=idx_mapping, seq_lens=seq_lens)
    check_at_least(idx_mapping.shape[0], "num_reqs", seq_lens=seq_lens)
    stride = shared_stride(
        "the per-row parameter columns",
        num_prompt_tokens,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
    )
    check_matrix(
        "counts_out", counts_out, i32, "[num_reqs, vocab_size]", num_rows=idx_mapping.shape[0]
    )
    check_table("token_ids", token_ids)
    return stride


__all__ = ["COUNT_MASK", "PROMPT_BIT", "build_penalty_counts", "build_penalty_counts_ref"]
