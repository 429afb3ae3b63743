"""slot_mapping: where each scheduled token's key and value go in the paged KV cache.

Token at position ``p`` of the request in table row ``r`` is stored in slot
``block_table[r, p // block_size] * block_size + p % block_size`` (vLLM's slot layout, the
``reshape_and_cache`` convention). Padding tokens of a CUDA-graph batch get ``-1``, which the
cache writer skips, so a padded batch never overwrites a live slot.
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
def _compute_slot_mapping_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    slot_mapping_ptr,
    num_reqs,
    num_tokens_padded,
    block_size,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SIZE)
    if pid < num_reqs:
        row = tl.load(idx_mapping_ptr + pid).to(tl.int64)
        start = tl.load(query_start_loc_ptr + pid)
        end = tl.load(query_start_loc_ptr + pid + 1)
        for block_start in range(start, end, BLOCK_SIZE):
            tok = block_start + offs
            mask = tok < end
            pos = tl.load(positions_ptr + tok, mask=mask, other=0)
            block_ids = tl.load(
                block_table_ptr + row * block_table_stride + pos // block_size, mask=mask, other=0
            )
            slots = block_ids.to(tl.int64) * block_size + pos % block_size
            tl.store(slot_mapping_ptr + tok, slots, mask=mask)
    else:
        _fill_padding_tokens(
            slot_mapping_ptr, query_start_loc_ptr, num_reqs, num_tokens_padded, -1, BLOCK_SIZE
        )


def compute_slot_mapping(
    idx_mapping: torch.Tensor,  # [>= num_reqs] int32, batch position -> table row
    query_start_loc: torch.Tensor,  # [>= num_reqs + 1] int32
    positions: torch.Tensor,  # [num_tokens_padded] int64
    block_table: torch.Tensor,  # [max_num_seqs, max_num_blocks_per_req] int32, by table row
    block_size: int,
    num_reqs: int,
    slot_mapping_out: torch.Tensor,  # [num_tokens_padded] int64, written in place; -1 = padding
) -> None:
    """Write each token's KV slot, ``-1`` for padding tokens (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    _check(
        idx_mapping, query_start_loc, positions, block_table, block_size, num_reqs, slot_mapping_out
    )
    _compute_slot_mapping_kernel[(num_reqs + 1,)](
        idx_mapping,
        query_start_loc,
        positions,
        block_table,
        block_table.stride(0),
        slot_mapping_out,
        num_reqs,
        slot_mapping_out.shape[0],
        block_size,
        BLOCK_SIZE=128,
    )


def compute_slot_mapping_ref(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    num_reqs: int,
    slot_mapping_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`compute_slot_mapping` (same arguments)."""
    _check(
        idx_mapping, query_start_loc, positions, block_table, block_size, num_reqs, slot_mapping_out
    )
    qsl = query_start_loc.to(torch.int64)
    total = int(qsl[num_reqs])
    rows = idx_mapping[:num_reqs].long().repeat_interleave(qsl[1 : num_reqs + 1] - qsl[:num_reqs])
    pos = positions[:total]
    blocks = block_table[rows, pos // block_size].long()
    slot_mapping_out.fill_(-1)
    slot_mapping_out[:total] = blocks * block_size + pos % block_size


def _check(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    num_reqs: int,
    slot_mapping_out: torch.Tensor,
) -> None:
    i32, i64 = torch.int32, torch.int64
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        query_start_loc=(query_start_loc, i32),
        positions=(positions, i64),
        block_table=(block_table, i32),
        slot_mapping_out=(slot_mapping_out, i64),
    )
    check_table("block_table", block_table)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    check_flat(
        idx_mapping=idx_mapping,
        query_start_loc=query_start_loc,
        positions=positions,
        slot_mapping_out=slot_mapping_out,
    )
    check_out_like("slot_mapping_out", slot_mapping_out, "positions", positions)
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)


__all__ = ["compute_slot_mapping", "compute_slot_mapping_ref"]
