"""query_start_loc: the cumulative query lengths of a step, built on the device.

runner_v2 sends only ``num_scheduled_tokens`` per batch position to the device; the cumulative
sum happens here (one program: a batch has at most ``max_num_seqs`` requests). Padding requests
of a CUDA-graph batch (positions ``num_reqs <= i < num_reqs_padded``) get empty queries: their
entries repeat the total, as in vLLM's padded ``query_start_loc``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat
from turnout.kernels._triton import require_triton, tl, triton


# The step's counts change every step: do_not_specialize keeps one compiled variant for all
# of them (Triton would otherwise compile again for 1, multiples of 16 and the rest).
@triton.jit(do_not_specialize=["num_reqs", "num_reqs_padded"])  # type: ignore[untyped-decorator]
def _prepare_query_start_loc_kernel(  # type: ignore[no-untyped-def]
    num_scheduled_ptr,
    query_start_loc_ptr,
    num_reqs,
    num_reqs_padded,
    BLOCK_SIZE: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_SIZE)
    # Padding requests schedule 0 tokens, so their cumulative entries equal the total.
    n = tl.load(num_scheduled_ptr + offs, mask=offs < num_reqs, other=0)
    cu = tl.cumsum(n, 0)
    tl.store(query_start_loc_ptr + offs, tl.zeros([BLOCK_SIZE], tl.int32), mask=offs == 0)
    tl.store(query_start_loc_ptr + 1 + offs, cu, mask=offs < num_reqs_padded)


def prepare_query_start_loc(
    num_scheduled: torch.Tensor,  # [>= num_reqs] int32, tokens scheduled per batch position
    num_reqs: int,
    query_start_loc_out: torch.Tensor,  # [num_reqs_padded + 1] int32, written in place
) -> None:
    """``query_start_loc_out = [0, cumsum(num_scheduled[:num_reqs]), total, ..., total]`` (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    num_reqs_padded = _check(num_scheduled, num_reqs, query_start_loc_out)
    block_size = triton.next_power_of_2(num_reqs_padded + 1)
    _prepare_query_start_loc_kernel[(1,)](
        num_scheduled, query_start_loc_out, num_reqs, num_reqs_padded, BLOCK_SIZE=block_size
    )


def prepare_query_start_loc_ref(
    num_scheduled: torch.Tensor,  # [>= num_reqs] int32
    num_reqs: int,
    query_start_loc_out: torch.Tensor,  # [num_reqs_padded + 1] int32
) -> None:
    """Torch reference of :func:`prepare_query_start_loc`."""
    num_reqs_padded = _check(num_scheduled, num_reqs, query_start_loc_out)
    cu = torch.cumsum(num_scheduled[:num_reqs].to(torch.int64), 0).to(torch.int32)
    query_start_loc_out[0] = 0
    query_start_loc_out[1 : num_reqs + 1] = cu
    total = cu[-1] if num_reqs > 0 else 0
    query_start_loc_out[num_reqs + 1 : num_reqs_padded + 1] = total


def _check(num_scheduled: torch.Tensor, num_reqs: int, out: torch.Tensor) -> int:
    check_dtypes(num_scheduled=(num_scheduled, torch.int32), query_start_loc_out=(out, torch.int32))
    check_flat(num_scheduled=num_scheduled, query_start_loc_out=out)
    check_at_least(num_reqs, "num_reqs", num_scheduled=num_scheduled)
    check_at_least(
        num_reqs + 1, "num_reqs + 1", query_start_loc_out=out
    )  # num_reqs_padded + 1 entries
    return out.shape[0] - 1


__all__ = ["prepare_query_start_loc", "prepare_query_start_loc_ref"]
