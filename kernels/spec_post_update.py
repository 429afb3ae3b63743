"""Post-update of a speculative step: append each request's accepted tokens to the device table
and advance its counters by what was accepted, not by what was scheduled.

For request ``i`` (table row ``r = idx_mapping[i]``), which scheduled ``num_scheduled[i]``
tokens of which the last ``num_spec[i]`` were drafts, and sampled (``seq_lens[i] >=
num_tokens[r]``: its prefill is complete) the ``num_sampled[i] = a + 1`` tokens
``sampled[i, :a + 1]`` (``a`` accepted drafts, then one more):

- ``token_ids[r, num_tokens .. num_tokens + a]`` = those tokens (cells past ``max_model_len``
  do not exist), ``num_tokens[r] += a + 1``, ``last_sampled[r]`` = the last of them;
- ``num_computed_tokens[r] += num_scheduled[i] - (num_spec[i] - a)``: the rejected drafts' KV
  does not count (their slots are written again by the next step, at the same positions);
- ``num_drafts[r]`` / ``num_accepted[r]``: drafts verified and accepted (0 for a partial
  prefill, which only advances ``num_computed_tokens``).

With no drafts (``num_spec = 0``, ``num_sampled = 1``) this is ``kernels/post_update.py``.
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


@triton.jit  # type: ignore[untyped-decorator]
def _post_update_spec_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    num_scheduled_ptr,
    num_spec_ptr,
    seq_lens_ptr,
    sampled_ptr,
    sampled_stride,
    num_sampled_ptr,
    num_drafts_ptr,
    num_computed_ptr,
    num_tokens_ptr,
    last_sampled_ptr,
    row_drafts_ptr,
    row_accepted_ptr,
    params_stride,
    token_ids_ptr,
    token_ids_stride,
    max_model_len,
    OUT_BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    p = row * params_stride
    num_tokens = tl.load(num_tokens_ptr + p)
    samples = tl.load(seq_lens_ptr + i) >= num_tokens
    g = tl.where(samples, tl.load(num_sampled_ptr + i), 0)
    rejected = tl.where(samples, tl.load(num_spec_ptr + i) - (g - 1), 0)
    tl.store(
        num_computed_ptr + p,
        tl.load(num_computed_ptr + p) + tl.load(num_scheduled_ptr + i) - rejected,
    )
    j = tl.arange(0, OUT_BLOCK)
    tokens = tl.load(sampled_ptr + i * sampled_stride + j, mask=j < g, other=0)
    tl.store(
        token_ids_ptr + row * token_ids_stride + num_tokens + j,
        tokens,
        mask=(j < g) & (num_tokens + j < max_model_len),
    )
    last = tl.max(tl.where(j == g - 1, tokens, -2147483647), axis=0)
    tl.store(num_tokens_ptr + p, num_tokens + g)
    tl.store(last_sampled_ptr + p, last, mask=samples)
    tl.store(row_drafts_ptr + p, tl.where(samples, tl.load(num_drafts_ptr + i), 0))
    tl.store(row_accepted_ptr + p, tl.where(samples, g - 1, 0))


def post_update_spec(
    idx_mapping: torch.Tensor,  # [num_reqs] int32, batch position -> table row
    num_scheduled: torch.Tensor,  # [num_reqs] int32, tokens scheduled (drafts included)
    num_spec: torch.Tensor,  # [num_reqs] int32, drafts scheduled (the last of those tokens)
    seq_lens: torch.Tensor,  # [>= num_reqs] int32, context after the step as scheduled
    sampled: torch.Tensor,  # [num_reqs, max_num_drafts + 1] int32, from rejection_sample
    num_sampled: torch.Tensor,  # [num_reqs] int32, accepted drafts + 1
    num_drafts: torch.Tensor,  # [num_reqs] int32, drafts verified (<= num_spec)
    num_computed: torch.Tensor,  # [max_num_seqs] int32 column, updated in place
    num_tokens: torch.Tensor,  # [max_num_seqs] int32 column (the same stride), updated
    last_sampled: torch.Tensor,  # [max_num_seqs] int32 column (the same stride), updated
    row_num_drafts: torch.Tensor,  # [max_num_seqs] int32 column (the same stride), written
    row_num_accepted: torch.Tensor,  # [max_num_seqs] int32 column (the same stride), written
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32, updated in place
) -> None:
    """Append accepted tokens and advance the counters (Triton; see the module docstring).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations.
    """
    require_triton()
    stride = _check(
        idx_mapping,
        num_scheduled,
        num_spec,
        seq_lens,
        sampled,
        num_sampled,
        num_drafts,
        num_computed,
        num_tokens,
        last_sampled,
        row_num_drafts,
        row_num_accepted,
        token_ids,
    )
    num_reqs = idx_mapping.shape[0]
    if num_reqs == 0:
        return
    _post_update_spec_kernel[(num_reqs,)](
        idx_mapping,
        num_scheduled,
        num_spec,
        seq_lens,
        sampled,
        sampled.stride(0),
        num_sampled,
        num_drafts,
        num_computed,
        num_tokens,
        last_sampled,
        row_num_drafts,
        row_num_accepted,
        stride,
        token_ids,
        token_ids.stride(0),
        token_ids.shape[1],
        OUT_BLOCK=triton.next_power_of_2(sampled.shape[1]),
    )


def post_update_spec_ref(
    idx_mapping: torch.Tensor,
    num_scheduled: torch.Tensor,
    num_spec: torch.Tensor,
    seq_lens: torch.Tensor,
    sampled: torch.Tensor,
    num_sampled: torch.Tensor,
    num_drafts: torch.Tensor,
    num_computed: torch.Tensor,
    num_tokens: torch.Tensor,
    last_sampled: torch.Tensor,
    row_num_drafts: torch.Tensor,
    row_num_accepted: torch.Tensor,
    token_ids: torch.Tensor,
) -> None:
    """Torch reference of :func:`post_update_spec` (same arguments; one request at a time)."""
    _check(
        idx_mapping,
        num_scheduled,
        num_spec,
        seq_lens,
        sampled,
        num_sampled,
        num_drafts,
        num_computed,
        num_tokens,
        last_sampled,
        row_num_drafts,
        row_num_accepted,
        token_ids,
    )
    width = token_ids.shape[1]
    for i, row in enumerate(idx_mapping.tolist()):
        n_tok = int(num_tokens[row])
        samples = int(seq_lens[i]) >= n_tok
        g = int(num_sampled[i]) if samples else 0
        rejected = int(num_spec[i]) - (g - 1) if samples else 0
        num_computed[row] += int(num_scheduled[i]) - rejected
        fits = max(0, min(g, width - n_tok))
        token_ids[row, n_tok : n_tok + fits] = sampled[i, :fits]
        num_tokens[row] = n_tok + g
        if samples:
            last_sampled[row] = sampled[i, g - 1]
        row_num_drafts[row] = int(num_drafts[i]) if samples else 0
        row_num_accepted[row] = g - 1 if samples else 0


def _check(
    idx_mapping: torch.Tensor,
    num_scheduled: torch.Tensor,
    num_spec: torch.Tensor,
    seq_lens: torch.Tensor,
    sampled: torch.Tensor,
    num_sampled: torch.Tensor,
    num_drafts: torch.Tensor,
    num_computed: torch.Tensor,
    num_tokens: torch.Tensor,
    last_sampled: torch.Tensor,
    row_num_drafts: torch.Tensor,
    row_num_accepted: torch.Tensor,
    token_ids: torch.Tensor,
) -> int:
    i32 = torch.int32
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        num_scheduled=(num_scheduled, i32),
        num_spec=(num_spec, i32),
        seq_lens=(seq_lens, i32),
        num_sampled=(num_sampled, i32),
        num_drafts=(num_drafts, i32),
        num_computed=(num_computed, i32),
        num_tokens=(num_tokens, i32),
        last_sampled=(last_sampled, i32),
        row_num_drafts=(row_num_drafts, i32),
        row_num_accepted=(row_num_accepted, i32),
        token_ids=(token_ids, i32),
    )
    check_flat(
        idx_mapping=idx_mapping,
        num_scheduled=num_scheduled,
        num_spec=num_spec,
        seq_lens=seq_lens,
        num_sampled=num_sampled,
        num_drafts=num_drafts,
    )
    num_reqs = idx_mapping.shape[0]
    check_at_least(
        num_reqs,
        "num_reqs",
        num_scheduled=num_scheduled,
        num_spec=num_spec,
        seq_lens=seq_lens,
        num_sampled=num_sampled,
        num_drafts=num_drafts,
    )
    check_matrix("sampled", sampled, i32, "[num_reqs, max_num_drafts + 1]", num_reqs)
    check_table("token_ids", token_ids)
    return shared_stride(
        "the table columns",
        num_computed,
        num_tokens,
        last_sampled,
        row_num_drafts,
        row_num_accepted,
    )


__all__ = ["post_update_spec", "post_update_spec_ref"]
