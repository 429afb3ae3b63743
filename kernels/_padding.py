"""``@triton.jit`` helper shared by the step-input kernels (positions, input ids, slots):
the CUDA-graph padding of a step's per-token outputs."""

from __future__ import annotations

from turnout.kernels._triton import tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _fill_padding_tokens(  # type: ignore[no-untyped-def]
    out_ptr,
    query_start_loc_ptr,
    num_reqs,
    num_tokens_padded,
    VALUE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # Tokens query_start_loc[num_reqs]:num_tokens_padded (a padded batch's extra tokens) get
    # VALUE in an int64 output.
    total = tl.load(query_start_loc_ptr + num_reqs)
    for block_start in range(total, num_tokens_padded, BLOCK_SIZE):
        tok = block_start + tl.arange(0, BLOCK_SIZE)
        tl.store(
            out_ptr + tok, tl.full([BLOCK_SIZE], VALUE, tl.int64), mask=tok < num_tokens_padded
        )
