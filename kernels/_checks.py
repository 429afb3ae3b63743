"""Argument checks shared by the kernel launchers and their references: a bad argument is a
ValueError that names it and says what was expected and what came, raised before any launch.

Every check reads only shapes, strides and dtypes (host metadata): none waits for the device.
"""

from __future__ import annotations

import torch


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.int32`` -> ``"int32"``."""
    return str(dtype).removeprefix("torch.")


def check_dtypes(**tensors: tuple[torch.Tensor, torch.dtype]) -> None:
    """``name=(tensor, dtype)`` pairs.

    Raises:
        ValueError: a tensor's dtype differs, naming it.
    """
    for name, (t, dtype) in tensors.items():
        if t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype_name(dtype)}, got {dtype_name(t.dtype)}")


def check_contiguous(**tensors: torch.Tensor) -> None:
    """Outputs written (or inputs read) as flat runs of elements.

    Raises:
        ValueError: a tensor is not contiguous, naming it.
    """
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def check_flat(**tensors: torch.Tensor) -> None:
    """Vectors a kernel reads or writes as one run of elements (``ptr + i``: it takes no stride
    for them), so a strided view would be read at the wrong elements.

    Raises:
        ValueError: a tensor is not 1-D or has no unit stride, naming it.
    """
    for name, t in tensors.items():
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(
                f"{name} must be a 1-D vector with unit stride (one run of "
                f"elements), got shape {tuple(t.shape)}, strides {t.stride()}"
            )


def check_table(name: str, table: torch.Tensor) -> None:
    """A ``[rows, width]`` table indexed as ``base + row * stride + col``.

    Raises:
        ValueError: not 2-D or no unit inner stride.
    """
    if table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(
            f"{name} must be a 2-D table with unit inner stride, "
            f"got shape {tuple(table.shape)}, strides {table.stride()}"
        )


def check_matrix(
    name: str,
    t: torch.Tensor,
    dtype: torch.dtype,
    dims: str,
    num_rows: int | None = None,
    num_cols: int | None = None,
) -> None:
    """A 2-D ``dtype`` tensor with a unit inner stride; ``dims`` names its dimensions in the
    message (``"[num_reqs, vocab_size]"``); ``num_rows`` / ``num_cols``, when given, are the
    sizes it must have.

    Raises:
        ValueError: any of these differs, naming the tensor.
    """
    ok = t.dtype == dtype and t.dim() == 2 and t.stride(1) == 1
    ok = (
        ok
        and (num_rows is None or t.shape[0] == num_rows)
        and (num_cols is None or t.shape[1] == num_cols)
    )
    if not ok:
        raise ValueError(
            f"{name} must be {dims} {dtype_name(dtype)} with unit inner stride, got "
            f"{tuple(t.shape)} {dtype_name(t.dtype)}, strides {t.stride()}"
        )


def check_vector(name: str, t: torch.Tensor, dtype: torch.dtype, length: int) -> None:
    """A ``[length]`` tensor of ``dtype`` with unit stride (read or written as one run).

    Raises:
        ValueError: the dtype, shape or stride differs, naming the tensor.
    """
    if t.dtype != dtype or tuple(t.shape) != (length,) or not t.is_contiguous():
        raise ValueError(
            f"{name} must be [{length}] {dtype_name(dtype)} with unit stride, "
            f"got {tuple(t.shape)} {dtype_name(t.dtype)}, strides {t.stride()}"
        )


def check_at_least(count: int, what: str, **tensors: torch.Tensor) -> None:
    """Each tensor has at least ``count`` entries in its first dimension; ``what`` says what
    ``count`` is (``"num_reqs"``, ``"num_reqs + 1"``).

    Raises:
        ValueError: ``count`` is negative, or a tensor is shorter (naming it).
    """
    if count < 0:
        raise ValueError(f"{what} must be >= 0, got {count}")
    for name, t in tensors.items():
        if t.dim() == 0:
            raise ValueError(f"{name} must have {what} entries at least, got a 0-d tensor")
        if t.shape[0] < count:
            raise ValueError(f"{what}={count} exceeds {name} ({t.shape[0]} entries)")


def check_num_reqs(num_reqs: int, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    """``num_reqs`` fits the batch's index arrays (``query_start_loc`` has one entry more).

    Raises:
        ValueError: ``num_reqs`` is negative or exceeds ``idx_mapping`` / ``query_start_loc``.
    """
    check_at_least(num_reqs, "num_reqs", idx_mapping=idx_mapping)
    check_at_least(num_reqs + 1, "num_reqs + 1", query_start_loc=query_start_loc)


def check_out_like(out_name: str, out: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    """An output written element for element of an input: same shape, contiguous.

    Raises:
        ValueError: the shapes differ or the output is not contiguous.
    """
    if out.shape != like.shape or not out.is_contiguous():
        raise ValueError(
            f"{out_name} must be contiguous with the (padded) shape of {like_name} "
            f"{tuple(like.shape)}, got {tuple(out.shape)}, strides {out.stride()}"
        )


def check_state_batch(
    query_start_loc: torch.Tensor, state_indices: torch.Tensor, has_initial_state: torch.Tensor
) -> None:
    """The index arrays of a varlen batch over per-request states (Mamba's conv and SSM
    states): ``num_reqs = len(state_indices)``, ``query_start_loc`` int32 with one entry more,
    ``state_indices`` int32 and ``has_initial_state`` bool with one entry per request.

    Raises:
        ValueError: a dtype, shape or stride differs, naming the array.
    """
    check_flat(
        state_indices=state_indices,
        query_start_loc=query_start_loc,
        has_initial_state=has_initial_state,
    )
    check_dtypes(
        state_indices=(state_indices, torch.int32),
        query_start_loc=(query_start_loc, torch.int32),
        has_initial_state=(has_initial_state, torch.bool),
    )
    num_reqs = state_indices.shape[0]
    if query_start_loc.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc must have num_reqs + 1 = {num_reqs + 1} entries "
            f"(num_reqs from state_indices), got {query_start_loc.shape[0]}"
        )
    if has_initial_state.shape[0] != num_reqs:
        raise ValueError(
            f"has_initial_state must have num_reqs = {num_reqs} entries "
            f"(one per state index), got {has_initial_state.shape[0]}"
        )


def check_one_per_row(name: str, t: torch.Tensor, rows_name: str, rows: torch.Tensor) -> None:
    """``t`` has one entry per row of ``rows`` (a decode step: one token per request).

    Raises:
        ValueError: the lengths differ.
    """
    if t.shape[0] != rows.shape[0]:
        raise ValueError(
            f"{name} must have one entry per row of {rows_name} ({rows.shape[0]}), got {t.shape[0]}"
        )


def shared_stride(what: str, *columns: torch.Tensor) -> int:
    """The one stride of columns read through a single stride argument (a packed table).

    Raises:
        ValueError: the strides differ (``what`` names the columns).
    """
    strides = {t.stride(0) for t in columns}
    if len(strides) != 1:
        raise ValueError(
            f"{what} must share one stride (one packed table), got strides {sorted(strides)}"
        )
    return strides.pop()


__all__ = [
    "check_at_least",
    "check_contiguous",
    "check_dtypes",
    "check_flat",
    "check_matrix",
    "check_num_reqs",
    "check_one_per_row",
    "check_out_like",
    "check_state_batch",
    "check_table",
    "check_vector",
    "dtype_name",
    "shared_stride",
]
