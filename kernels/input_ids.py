"""Gather the input token ids of a step from the device request table.

Request ``i`` (table row ``idx_mapping[i]``) feeds positions ``p = num_computed + j``. A
position below the row's ``prefill_len`` (the prompt, or the whole token list of a request
resumed after preemption) is read from the token table; a later position is a decode and takes
``last_sampled[row]``, the token the previous step sampled on the device (written there by
``post_update``): the sampled ids never make a round trip through the host before they are fed
back, which is what lets the scheduler plan step N+1 while step N runs.

Padding tokens (``query_start_loc[num_reqs]:num_tokens_padded``) get id 0.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import (
    check_dtypes,
    check_flat,
    check_num_reqs,
    check_out_like,
    check_table,
)
from turnout.kernels._padding import _fill_padding_tokens
from turnout.kernels._triton import require_triton, tl, triton


# The step's counts change every step: do_not_specialize keeps one compiled variant for all
# of them (Triton would otherwise compile again for 1, multiples of 16 and the rest).
@triton.jit(do_not_specialize=["num_reqs", "num_tokens_padded"])  # type: ignore[untyped-decorator]
def _prepare_input_ids_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    query_start_loc_ptr,
    positions_ptr,
    prefill_len_ptr,
    prefill_len_stride,
    last_sampled_ptr,
    last_sampled_stride,
    token_ids_ptr,
    token_ids_stride,
    input_ids_ptr,
    num_reqs,
    num_tokens_padded,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SIZE)
    if pid < num_reqs:
        row = tl.load(idx_mapping_ptr + pid).to(tl.int64)
        prefill_len = tl.load(prefill_len_ptr + row * prefill_len_stride)
        last_sampled = tl.load(last_sampled_ptr + row * last_sampled_stride)
        start = tl.load(query_start_loc_ptr + pid)
        end = tl.load(query_start_loc_ptr + pid + 1)
        for block_start in range(start, end, BLOCK_SIZE):
            tok = block_start + offs
            mask = tok < end
            pos = tl.load(positions_ptr + tok, mask=mask, other=0)
            from_table = pos < prefill_len
            ids = tl.load(
                token_ids_ptr + row * token_ids_stride + pos, mask=mask & from_table, other=0
            )
            ids = tl.where(from_table, ids, last_sampled)
            tl.store(input_ids_ptr + tok, ids.to(tl.int64), mask=mask)
    else:
        _fill_padding_tokens(
            input_ids_ptr, query_start_loc_ptr, num_reqs, num_tokens_padded, 0, BLOCK_SIZE
        )


def prepare_input_ids(
    idx_mapping: torch.Tensor,  # [>= num_reqs] int32, batch position -> table row
    query_start_loc: torch.Tensor,  # [>= num_reqs + 1] int32
    positions: torch.Tensor,  # [num_tokens_padded] int64, from prepare_positions
    prefill_len: torch.Tensor,  # [max_num_seqs] int32 (any stride): tokens written at add time
    last_sampled: torch.Tensor,  # [max_num_seqs] int32 (any stride): last sampled id per row
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32 (unit inner stride)
    num_reqs: int,
    input_ids_out: torch.Tensor,  # [num_tokens_padded] int64, written in place
) -> None:
    """Write the step's input ids, decodes taking the device-side last sampled token (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    _check(
        idx_mapping,
        query_start_loc,
        positions,
        prefill_len,
        last_sampled,
        token_ids,
        num_reqs,
        input_ids_out,
    )
    _prepare_input_ids_kernel[(num_reqs + 1,)](
        idx_mapping,
        query_start_loc,
        positions,
        prefill_len,
        prefill_len.stride(0),
        last_sampled,
        last_sampled.stride(0),
        token_ids,
        token_ids.stride(0),
        input_ids_out,
        num_reqs,
        input_ids_out.shape[0],
        BLOCK_SIZE=128,
    )


def prepare_input_ids_ref(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    prefill_len: torch.Tensor,
    last_sampled: torch.Tensor,
    token_ids: torch.Tensor,
    num_reqs: int,
    input_ids_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`prepare_input_ids` (same arguments)."""
    _check(
        idx_mapping,
        query_start_loc,
        positions,
        prefill_len,
        last_sampled,
        token_ids,
        num_reqs,
        input_ids_out,
    )
    qsl = query_start_loc.to(torch.int64)
    total = int(qsl[num_reqs])
    num_sched = qsl[1 : num_reqs + 1] - qsl[:num_reqs]
    rows = idx_mapping[:num_reqs].long().repeat_interleave(num_sched)
    pos = positions[:total]
    from_table = pos < prefill_len[rows].long()
    table_ids = token_ids[rows, pos.clamp(max=token_ids.shape[1] - 1)]
    input_ids_out.zero_()
    input_ids_out[:total] = torch.where(from_table, table_ids, last_sampled[rows]).long()


def _check(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    prefill_len: torch.Tensor,
    last_sampled: torch.Tensor,
    token_ids: torch.Tensor,
    num_reqs: int,
    input_ids_out: torch.Tensor,
) -> None:
    i32, i64 = torch.int32, torch.int64
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        query_start_loc=(query_start_loc, i32),
        positions=(positions, i64),
        prefill_len=(prefill_len, i32),
        last_sampled=(last_sampled, i32),
        token_ids=(token_ids, i32),
        input_ids_out=(input_ids_out, i64),
    )
    check_table("token_ids", token_ids)
    check_flat(
        idx_mapping=idx_mapping,
        query_start_loc=query_start_loc,
        positions=positions,
        input_ids_out=input_ids_out,
    )
    check_out_like("input_ids_out", input_ids_out, "positions", positions)
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)


__all__ = ["prepare_input_ids", "prepare_input_ids_ref"]
