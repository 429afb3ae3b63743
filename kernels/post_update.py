"""Post-update: after sampling, append the sampled ids to the device table and advance counters.

For request ``i`` of the batch (table row ``r = idx_mapping[i]``):

- ``num_computed_tokens[r] += num_scheduled[i]`` (the step's tokens are now in the KV cache);
- if the request sampled this step (``seq_lens[i] >= num_tokens[r]``: its prefill is complete,
  not a partial chunk), ``token_ids[r, num_tokens[r]] = sampled[i]`` (when that cell exists:
  a token at position ``max_model_len`` ends its request), ``num_tokens[r] += 1`` and
  ``last_sampled[r] = sampled[i]``.

This runs on the device right after the sampler, so the next step's ``prepare_input_ids`` finds
the token without the host ever seeing it (docs/architecture.md §5.4, §5.5: post-forward
updates run after sampling).
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat, check_table
from turnout.kernels._triton import require_triton, tl, triton


# The step's counts change every step: do_not_specialize keeps one compiled variant for all
# of them (Triton would otherwise compile again for 1, multiples of 16 and the rest).
@triton.jit(do_not_specialize=["num_reqs"])  # type: ignore[untyped-decorator]
def _post_update_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    num_scheduled_ptr,
    seq_lens_ptr,
    sampled_ptr,
    num_computed_ptr,
    num_computed_stride,
    num_tokens_ptr,
    num_tokens_stride,
    last_sampled_ptr,
    last_sampled_stride,
    token_ids_ptr,
    token_ids_stride,
    max_model_len,
    num_reqs,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per block of requests; rows are distinct within a step, so no write races.
    req = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = req < num_reqs
    row = tl.load(idx_mapping_ptr + req, mask=mask, other=0).to(tl.int64)
    num_scheduled = tl.load(num_scheduled_ptr + req, mask=mask, other=0)
    seq_len = tl.load(seq_lens_ptr + req, mask=mask, other=0)
    sampled = tl.load(sampled_ptr + req, mask=mask, other=0)
    num_computed = tl.load(num_computed_ptr + row * num_computed_stride, mask=mask, other=0)
    tl.store(num_computed_ptr + row * num_computed_stride, num_computed + num_scheduled, mask=mask)
    num_tokens = tl.load(num_tokens_ptr + row * num_tokens_stride, mask=mask, other=0)
    samples = mask & (seq_len >= num_tokens)
    # A token sampled at position max_model_len finishes its request (length cap) and has no
    # cell in the table.
    tl.store(
        token_ids_ptr + row * token_ids_stride + num_tokens,
        sampled,
        mask=samples & (num_tokens < max_model_len),
    )
    tl.store(num_tokens_ptr + row * num_tokens_stride, num_tokens + 1, mask=samples)
    tl.store(last_sampled_ptr + row * last_sampled_stride, sampled, mask=samples)


def post_update(
    idx_mapping: torch.Tensor,  # [>= num_reqs] int32, batch position -> table row
    num_scheduled: torch.Tensor,  # [>= num_reqs] int32
    seq_lens: torch.Tensor,  # [>= num_reqs] int32, context after the step
    sampled: torch.Tensor,  # [>= num_reqs] int32, sampled ids by batch position
    num_computed: torch.Tensor,  # [max_num_seqs] int32 (any stride), updated in place
    num_tokens: torch.Tensor,  # [max_num_seqs] int32 (any stride), updated in place
    last_sampled: torch.Tensor,  # [max_num_seqs] int32 (any stride), updated in place
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32, updated in place
    num_reqs: int,
) -> None:
    """Append sampled ids and advance ``num_computed`` / ``num_tokens`` (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    _check(
        idx_mapping,
        num_scheduled,
        seq_lens,
        sampled,
        num_computed,
        num_tokens,
        last_sampled,
        token_ids,
        num_reqs,
    )
    if num_reqs == 0:
        return
    block_size = 128
    _post_update_kernel[(triton.cdiv(num_reqs, block_size),)](
        idx_mapping,
        num_scheduled,
        seq_lens,
        sampled,
        num_computed,
        num_computed.stride(0),
        num_tokens,
        num_tokens.stride(0),
        last_sampled,
        last_sampled.stride(0),
        token_ids,
        token_ids.stride(0),
        token_ids.shape[1],
        num_reqs,
        BLOCK_SIZE=block_size,
    )


def post_update_ref(
    idx_mapping: torch.Tensor,
    num_scheduled: torch.Tensor,
    seq_lens: torch.Tensor,
    sampled: torch.Tensor,
    num_computed: torch.Tensor,
    num_tokens: torch.Tensor,
    last_sampled: torch.Tensor,
    token_ids: torch.Tensor,
    num_reqs: int,
) -> None:
    """Torch reference of :func:`post_update` (same arguments)."""
    _check(
        idx_mapping,
        num_scheduled,
        seq_lens,
        sampled,
        num_computed,
        num_tokens,
        last_sampled,
        token_ids,
        num_reqs,
    )
    rows = idx_mapping[:num_reqs].long()
    n = num_tokens[rows]
    samples = seq_lens[:num_reqs] >= n
    num_computed[rows] += num_scheduled[:num_reqs]
    s_rows, s_n, s_ids = rows[samples], n[samples].long(), sampled[:num_reqs][samples]
    fits = s_n < token_ids.shape[1]
    token_ids[s_rows[fits], s_n[fits]] = s_ids[fits]
    num_tokens[s_rows] += 1
    last_sampled[s_rows] = s_ids


def _check(
    idx_mapping: torch.Tensor,
    num_scheduled: torch.Tensor,
    seq_lens: torch.Tensor,
    sampled: torch.Tensor,
    num_computed: torch.Tensor,
    num_tokens: torch.Tensor,
    last_sampled: torch.Tensor,
    token_ids: torch.Tensor,
    num_reqs: int,
) -> None:
    i32 = torch.int32
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        num_scheduled=(num_scheduled, i32),
        seq_lens=(seq_lens, i32),
        sampled=(sampled, i32),
        num_computed=(num_computed, i32),
        num_tokens=(num_tokens, i32),
        last_sampled=(last_sampled, i32),
        token_ids=(token_ids, i32),
    )
    check_table("token_ids", token_ids)
    check_flat(
        idx_mapping=idx_mapping, num_scheduled=num_scheduled, seq_lens=seq_lens, sampled=sampled
    )
    check_at_least(
        num_reqs,
        "num_reqs",
        idx_mapping=idx_mapping,
        num_scheduled=num_scheduled,
        seq_lens=seq_lens,
        sampled=sampled,
    )


__all__ = ["post_update", "post_update_ref"]
