"""Staged writes: scatter host-prepared runs of int32 values into device tables in one launch.

runner_v2 keeps its request table on the device. When requests arrive (their prompt tokens,
their sampling parameters) or gain KV blocks (block-table diffs), the host packs every run of
new values into one pinned buffer, copies it with a single non-blocking H2D transfer, and this
kernel writes each run to its place. One launch per step, whatever the number of writes,
instead of one small copy per field (vLLM MRV2 stages its block-table diffs the same way,
vLLM PR #25266).

A write ``w`` copies ``values[cu_num_values[w]:cu_num_values[w + 1]]`` to
``dst[dst_offsets[w]:dst_offsets[w] + n]`` where ``dst`` is a flat int32 tensor (the runner's
arena holding all its tables). Writes of one launch must not overlap.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_dtypes, check_flat
from turnout.kernels._triton import require_triton, tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _apply_staged_writes_kernel(  # type: ignore[no-untyped-def]
    dst_ptr,
    dst_offsets_ptr,
    cu_num_values_ptr,
    values_ptr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per write; a long run (a 32k-token prompt) loops over blocks.
    w = tl.program_id(0)
    dst_start = tl.load(dst_offsets_ptr + w)
    start = tl.load(cu_num_values_ptr + w)
    end = tl.load(cu_num_values_ptr + w + 1)
    for block_start in range(start, end, BLOCK_SIZE):
        offs = block_start + tl.arange(0, BLOCK_SIZE)
        mask = offs < end
        values = tl.load(values_ptr + offs, mask=mask)
        tl.store(dst_ptr + dst_start + (offs - start).to(tl.int64), values, mask=mask)


def apply_staged_writes(
    dst: torch.Tensor,  # [arena_size] int32, contiguous, written in place
    dst_offsets: torch.Tensor,  # [num_writes] int64, first element of each run in dst
    cu_num_values: torch.Tensor,  # [num_writes + 1] int32, cumulative run lengths, [0] == 0
    values: torch.Tensor,  # [cu_num_values[-1]] int32, the runs back to back
) -> None:
    """Copy each staged run of ``values`` into ``dst`` at its offset (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or contiguity do not match the annotations.
    """
    require_triton()
    _check(dst, dst_offsets, cu_num_values, values)
    num_writes = dst_offsets.shape[0]
    if num_writes == 0:
        return  # nothing staged this step: skip the launch
    _apply_staged_writes_kernel[(num_writes,)](
        dst, dst_offsets, cu_num_values, values, BLOCK_SIZE=1024
    )


def apply_staged_writes_ref(
    dst: torch.Tensor,  # [arena_size] int32
    dst_offsets: torch.Tensor,  # [num_writes] int64
    cu_num_values: torch.Tensor,  # [num_writes + 1] int32
    values: torch.Tensor,  # [cu_num_values[-1]] int32
) -> None:
    """Torch reference of :func:`apply_staged_writes` (host loop; tests only)."""
    _check(dst, dst_offsets, cu_num_values, values)
    cu = cu_num_values.tolist()
    for w, start in enumerate(dst_offsets.tolist()):
        n = cu[w + 1] - cu[w]
        dst[start : start + n] = values[cu[w] : cu[w + 1]]


def _check(
    dst: torch.Tensor, dst_offsets: torch.Tensor, cu_num_values: torch.Tensor, values: torch.Tensor
) -> None:
    i32 = torch.int32
    check_dtypes(
        dst=(dst, i32),
        values=(values, i32),
        dst_offsets=(dst_offsets, torch.int64),
        cu_num_values=(cu_num_values, i32),
    )
    check_flat(dst=dst, dst_offsets=dst_offsets, cu_num_values=cu_num_values, values=values)
    if cu_num_values.shape[0] != dst_offsets.shape[0] + 1:
        raise ValueError(
            f"cu_num_values has {cu_num_values.shape[0]} entries for {dst_offsets.shape[0]} writes (want writes + 1)"
        )


__all__ = ["apply_staged_writes", "apply_staged_writes_ref"]
