"""Argument checks shared by the kernel launchers (a bad argument is a ValueError naming it,
raised before any launch)."""

from __future__ import annotations

import torch


def check_dtypes(**tensors: tuple[torch.Tensor, torch.dtype]) -> None:
    """``name=(tensor, dtype)`` pairs.

    Raises:
        ValueError: a tensor's dtype differs, naming it.
    """
    for name, (t, dtype) in tensors.items():
        if t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {t.dtype}")


def check_table(name: str, table: torch.Tensor) -> None:
    """A ``[rows, width]`` table indexed as ``base + row * stride + col``.

    Raises:
        ValueError: not 2-D or no unit inner stride.
    """
    if table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(f"{name} must be a 2-D table with unit inner stride")


def check_num_reqs(num_reqs: int, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    """``num_reqs`` fits the batch's index arrays.

    Raises:
        ValueError: ``num_reqs`` is negative or exceeds ``idx_mapping`` / ``query_start_loc``.
    """
    if not 0 <= num_reqs <= min(idx_mapping.shape[0], query_start_loc.shape[0] - 1):
        raise ValueError(f"num_reqs={num_reqs} exceeds idx_mapping or query_start_loc")


__all__ = ["check_dtypes", "check_num_reqs", "check_table"]
