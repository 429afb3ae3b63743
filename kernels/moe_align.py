"""Grouping a MoE layer's (token, expert) assignments by expert, each expert's run padded to a
multiple of ``BLOCK_M`` (vLLM's ``moe_align_block_size``,
vllm/model_executor/layers/fused_moe/moe_align_block_size.py): the input of the grouped GEMMs
of ``kernels.fused_moe``, whose module docstring says why this is a Triton kernel.

One program: a histogram of the expert ids gives the counts, a cumulative sum the padded
offsets, and an atomic cursor per expert each assignment's slot. Assignment ``t * k + j`` is
token ``t``'s ``j``-th expert; padding slots hold the sentinel ``T * k``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import dtype_name
from turnout.kernels._triton import require_triton, tl, triton


def max_num_tokens_padded(num_assignments: int, num_experts: int, block_m: int) -> int:
    """Upper bound of ``num_tokens_post_padded``: each expert that gets an assignment pads its
    run by at most ``block_m - 1`` slots, and at most ``min(E, T * k)`` experts get one."""
    return num_assignments + min(num_experts, num_assignments) * (block_m - 1)


@triton.jit  # type: ignore[untyped-decorator]
def _moe_align_block_size_kernel(  # type: ignore[no-untyped-def]
    topk_ids_ptr,  # [num_assignments] int32 (topk_ids flattened)
    sorted_token_ids_ptr,  # [max_num_tokens_padded] int32, written
    expert_ids_ptr,  # [max_num_blocks] int32, written (-1 past the padded total)
    num_tokens_post_padded_ptr,  # [1] int32, written
    cursor_ptr,  # [NUM_BINS] int32 scratch: next free slot per expert
    num_assignments,
    max_num_blocks,
    NUM_EXPERTS: tl.constexpr,
    NUM_BINS: tl.constexpr,  # power of two > NUM_EXPERTS: bin NUM_EXPERTS takes masked lanes
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCKS_CHUNK: tl.constexpr,
):
    bins = tl.arange(0, NUM_BINS)
    counts = tl.zeros([NUM_BINS], dtype=tl.int32)
    for start in range(0, num_assignments, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_assignments, other=NUM_EXPERTS)
        counts += tl.histogram(ids, NUM_BINS)
    counts = tl.where(bins < NUM_EXPERTS, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(num_tokens_post_padded_ptr, total)
    tl.store(cursor_ptr + bins, starts)
    # The padding slots of each run get the sentinel; the real slots are written below, so the
    # two sets of stores never touch the same slot.
    first_pad = starts + counts
    for j in range(0, BLOCK_M - 1):
        slot = first_pad + j
        tl.store(
            sorted_token_ids_ptr + slot,
            tl.full([NUM_BINS], 0, tl.int32) + num_assignments,
            mask=slot < ends,
        )
    for b0 in range(0, max_num_blocks, BLOCKS_CHUNK):
        blk = b0 + tl.arange(0, BLOCKS_CHUNK)
        # the expert of a block: how many runs end at or before its first slot
        owner = tl.sum((ends[None, :] <= (blk * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        owner = tl.where(blk * BLOCK_M < total, owner, -1)
        tl.store(expert_ids_ptr + blk, owner, mask=blk < max_num_blocks)
    tl.debug_barrier()  # the cursors' initial values are visible to every thread's atomics
    for start in range(0, num_assignments, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        mask = offs < num_assignments
        ids = tl.load(topk_ids_ptr + offs, mask=mask, other=0)
        slot = tl.atomic_add(cursor_ptr + ids, 1, mask=mask)
        tl.store(sorted_token_ids_ptr + slot, offs, mask=mask)


def moe_align_block_size(
    topk_ids: torch.Tensor,  # [T, k] int32, expert of each assignment, in [0, num_experts)
    block_m: int,
    num_experts: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the assignments by expert, each run padded to a multiple of ``block_m`` (Triton).

    Returns ``sorted_token_ids [max_num_tokens_padded] int32`` (assignment ``t * k + j``, or the
    sentinel ``T * k`` in padding slots; slots past the padded total are unspecified),
    ``expert_ids [cdiv(max_num_tokens_padded, block_m)] int32`` (-1 past the total) and
    ``num_tokens_post_padded [1] int32``. Ids outside ``[0, num_experts)`` are not checked (that
    would need a sync): the reference checks them.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: ``topk_ids`` is not a contiguous ``[T, k]`` int32 tensor, or ``block_m``
            is not a power of two >= 16.
    """
    require_triton()
    num_assignments = _check_align(topk_ids, block_m, num_experts)
    sorted_ids, expert_ids, num_post = _align_outputs(topk_ids, block_m, num_experts)
    if num_assignments == 0:
        num_post.zero_()
        expert_ids.fill_(-1)
        return sorted_ids, expert_ids, num_post
    num_bins = triton.next_power_of_2(num_experts + 1)
    cursor = torch.empty(num_bins, dtype=torch.int32, device=topk_ids.device)
    _moe_align_block_size_kernel[(1,)](
        topk_ids,
        sorted_ids,
        expert_ids,
        num_post,
        cursor,
        num_assignments,
        expert_ids.shape[0],
        NUM_EXPERTS=num_experts,
        NUM_BINS=num_bins,
        BLOCK_M=block_m,
        CHUNK=min(1024, max(16, triton.next_power_of_2(num_assignments))),
        BLOCKS_CHUNK=max(1, min(64, 8192 // num_bins)),
        num_warps=4,
    )
    return sorted_ids, expert_ids, num_post


def moe_align_block_size_ref(
    topk_ids: torch.Tensor,  # [T, k] int32
    block_m: int,
    num_experts: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`moe_align_block_size`: a stable sort, so each expert's run
    lists its assignments in ascending order (the interpreter's atomics give the same order;
    a GPU's may not). Slots past the padded total hold the sentinel.

    Raises:
        ValueError: as :func:`moe_align_block_size`, or an expert id out of range (read on
            the host).
    """
    num_assignments = _check_align(topk_ids, block_m, num_experts)
    sorted_ids, expert_ids, num_post = _align_outputs(topk_ids, block_m, num_experts)
    flat = topk_ids.flatten().long()
    if num_assignments and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        raise ValueError(
            f"topk_ids must lie in [0, {num_experts}), got [{int(flat.min())}, {int(flat.max())}]"
        )
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    rank = (
        torch.arange(num_assignments, device=flat.device)
        - (torch.cumsum(counts, 0) - counts)[flat[order]]
    )
    sorted_ids.fill_(num_assignments)
    sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
    total = int(padded.sum())
    num_post.fill_(total)
    owners = torch.repeat_interleave(
        torch.arange(num_experts, device=flat.device), padded // block_m
    )
    expert_ids.fill_(-1)
    expert_ids[: owners.numel()] = owners.to(torch.int32)
    return sorted_ids, expert_ids, num_post


def _check_align(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> int:
    if topk_ids.dtype != torch.int32 or topk_ids.dim() != 2 or not topk_ids.is_contiguous():
        raise ValueError(
            f"topk_ids must be a contiguous [T, k] int32 tensor, got "
            f"{tuple(topk_ids.shape)} {dtype_name(topk_ids.dtype)}, strides {topk_ids.stride()}"
        )
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m}")
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    return topk_ids.numel()


def _align_outputs(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    max_padded = max_num_tokens_padded(topk_ids.numel(), num_experts, block_m)
    dev = topk_ids.device
    return (
        torch.empty(max_padded, dtype=torch.int32, device=dev),
        torch.empty(triton.cdiv(max_padded, block_m), dtype=torch.int32, device=dev),
        torch.empty(1, dtype=torch.int32, device=dev),
    )


__all__ = ["max_num_tokens_padded", "moe_align_block_size", "moe_align_block_size_ref"]
