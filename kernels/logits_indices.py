"""logits_indices: which hidden states of a step are turned into logits.

A step computes logits only for the last scheduled token of each request
(``query_start_loc[i + 1] - 1``): the one whose next token is sampled. Partial prefill chunks
get an index too (their sample is simply discarded), which keeps the shape a function of
``num_reqs`` alone. Prompt logprobs take their own bounded chunks (``runner_v2``).
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat
from turnout.kernels._triton import require_triton, tl, triton


# The step's counts change every step: do_not_specialize keeps one compiled variant for all
# of them (Triton would otherwise compile again for 1, multiples of 16 and the rest).
@triton.jit(do_not_specialize=["num_reqs"])  # type: ignore[untyped-decorator]
def _compute_logits_indices_kernel(  # type: ignore[no-untyped-def]
    query_start_loc_ptr,
    logits_indices_ptr,
    num_reqs,
    BLOCK_SIZE: tl.constexpr,
):
    block = tl.program_id(0)
    req = block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = req < num_reqs
    end = tl.load(query_start_loc_ptr + req + 1, mask=mask, other=1)
    tl.store(logits_indices_ptr + req, (end - 1).to(tl.int64), mask=mask)


def compute_logits_indices(
    query_start_loc: torch.Tensor,  # [>= num_reqs + 1] int32
    num_reqs: int,
    logits_indices_out: torch.Tensor,  # [>= num_reqs] int64, written in place
) -> None:
    """``logits_indices_out[i] = query_start_loc[i + 1] - 1`` for ``i < num_reqs`` (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    _check(query_start_loc, num_reqs, logits_indices_out)
    if num_reqs == 0:
        return  # an empty step computes no logits
    block_size = 256
    _compute_logits_indices_kernel[(triton.cdiv(num_reqs, block_size),)](
        query_start_loc, logits_indices_out, num_reqs, BLOCK_SIZE=block_size
    )


def compute_logits_indices_ref(
    query_start_loc: torch.Tensor, num_reqs: int, logits_indices_out: torch.Tensor
) -> None:
    """Torch reference of :func:`compute_logits_indices`."""
    _check(query_start_loc, num_reqs, logits_indices_out)
    logits_indices_out[:num_reqs] = query_start_loc[1 : num_reqs + 1].long() - 1


def _check(query_start_loc: torch.Tensor, num_reqs: int, out: torch.Tensor) -> None:
    check_dtypes(
        query_start_loc=(query_start_loc, torch.int32), logits_indices_out=(out, torch.int64)
    )
    check_flat(query_start_loc=query_start_loc, logits_indices_out=out)
    check_at_least(num_reqs, "num_reqs", logits_indices_out=out)
    check_at_least(num_reqs + 1, "num_reqs + 1", query_start_loc=query_start_loc)


__all__ = ["compute_logits_indices", "compute_logits_indices_ref"]
