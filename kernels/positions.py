"""Positions of every scheduled token and the per-request ``seq_lens`` of a step.

Request ``i`` of the batch (table row ``idx_mapping[i]``) owns the tokens
``query_start_loc[i]:query_start_loc[i + 1]``; its ``j``-th scheduled token sits at position
``num_computed_tokens[row] + j`` and its context after the step is ``seq_lens[i] =
num_computed_tokens[row] + num_scheduled``. ``num_computed_tokens`` is read from the device
table, so no per-request count crosses from the host.

Padding (a CUDA-graph batch): tokens ``query_start_loc[num_reqs]:num_tokens_padded`` get
position 0 (a valid rotary index) and padding requests get ``seq_lens == 0``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat
from turnout.kernels._padding import _fill_padding_tokens
from turnout.kernels._triton import require_triton, tl, triton


# The step's counts change every step: do_not_specialize keeps one compiled variant for all
# of them (Triton would otherwise compile again for 1, multiples of 16 and the rest).
@triton.jit(do_not_specialize=["num_reqs", "num_reqs_padded", "num_tokens_padded"])  # type: ignore[untyped-decorator]
def _prepare_positions_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    num_computed_ptr,
    num_computed_stride,
    query_start_loc_ptr,
    positions_ptr,
    seq_lens_ptr,
    num_reqs,
    num_reqs_padded,
    num_tokens_padded,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per request, plus a last one (pid == num_reqs) that writes the padding.
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SIZE)
    if pid < num_reqs:
        row = tl.load(idx_mapping_ptr + pid).to(tl.int64)
        num_computed = tl.load(num_computed_ptr + row * num_computed_stride)
        start = tl.load(query_start_loc_ptr + pid)
        end = tl.load(query_start_loc_ptr + pid + 1)
        for block_start in range(start, end, BLOCK_SIZE):
            tok = block_start + offs
            pos = num_computed + (tok - start)
            tl.store(positions_ptr + tok, pos.to(tl.int64), mask=tok < end)
        tl.store(seq_lens_ptr + pid, num_computed + (end - start))
    else:
        _fill_padding_tokens(
            positions_ptr, query_start_loc_ptr, num_reqs, num_tokens_padded, 0, BLOCK_SIZE
        )
        for block_start in range(num_reqs, num_reqs_padded, BLOCK_SIZE):
            req = block_start + offs
            tl.store(
                seq_lens_ptr + req, tl.zeros([BLOCK_SIZE], tl.int32), mask=req < num_reqs_padded
            )


def prepare_positions(
    idx_mapping: torch.Tensor,  # [>= num_reqs] int32, batch position -> table row
    num_computed: torch.Tensor,  # [max_num_seqs] int32 (any stride), per table row
    query_start_loc: torch.Tensor,  # [num_reqs_padded + 1] int32
    num_reqs: int,
    positions_out: torch.Tensor,  # [num_tokens_padded] int64, written in place
    seq_lens_out: torch.Tensor,  # [num_reqs_padded] int32, written in place
) -> None:
    """Write the positions of the step's tokens and each request's ``seq_lens`` (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    _check(idx_mapping, num_computed, query_start_loc, num_reqs, positions_out, seq_lens_out)
    _prepare_positions_kernel[(num_reqs + 1,)](
        idx_mapping,
        num_computed,
        num_computed.stride(0),
        query_start_loc,
        positions_out,
        seq_lens_out,
        num_reqs,
        seq_lens_out.shape[0],
        positions_out.shape[0],
        BLOCK_SIZE=128,
    )


def prepare_positions_ref(
    idx_mapping: torch.Tensor,  # [>= num_reqs] int32
    num_computed: torch.Tensor,  # [max_num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_reqs_padded + 1] int32
    num_reqs: int,
    positions_out: torch.Tensor,  # [num_tokens_padded] int64
    seq_lens_out: torch.Tensor,  # [num_reqs_padded] int32
) -> None:
    """Torch reference of :func:`prepare_positions`."""
    _check(idx_mapping, num_computed, query_start_loc, num_reqs, positions_out, seq_lens_out)
    qsl = query_start_loc.to(torch.int64)
    num_sched = qsl[1 : num_reqs + 1] - qsl[:num_reqs]
    nc = num_computed[idx_mapping[:num_reqs].long()].to(torch.int64)
    total = int(qsl[num_reqs])
    req_of_token = torch.repeat_interleave(torch.arange(num_reqs, device=qsl.device), num_sched)
    offset_in_req = torch.arange(total, device=qsl.device) - qsl[req_of_token]
    positions_out.zero_()
    positions_out[:total] = nc[req_of_token] + offset_in_req
    seq_lens_out.zero_()
    seq_lens_out[:num_reqs] = (nc + num_sched).to(torch.int32)


def _check(
    idx_mapping: torch.Tensor,
    num_computed: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_reqs: int,
    positions_out: torch.Tensor,
    seq_lens_out: torch.Tensor,
) -> None:
    i32 = torch.int32
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        num_computed=(num_computed, i32),
        query_start_loc=(query_start_loc, i32),
        positions_out=(positions_out, torch.int64),
        seq_lens_out=(seq_lens_out, i32),
    )
    check_flat(
        idx_mapping=idx_mapping,
        query_start_loc=query_start_loc,
        positions_out=positions_out,
        seq_lens_out=seq_lens_out,
    )
    check_at_least(num_reqs, "num_reqs", idx_mapping=idx_mapping, seq_lens_out=seq_lens_out)
    if query_start_loc.shape[0] != seq_lens_out.shape[0] + 1:
        raise ValueError(
            "query_start_loc must have num_reqs_padded + 1 entries (seq_lens_out has num_reqs_padded)"
        )


__all__ = ["prepare_positions", "prepare_positions_ref"]
