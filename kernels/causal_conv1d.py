"""Causal depthwise conv1d of Mamba-1 over packed (varlen) requests, with a per-request state.

For request ``i`` (tokens ``query_start_loc[i]:query_start_loc[i + 1]`` of ``x``, ``L`` of
them, slot ``state_indices[i]``), the sequence ``xpad = [prev ; x_i]`` is convolved causally,
one channel at a time, where ``prev`` (``[dim, width - 1]``) is the slot's stored state when
``has_initial_state[i]`` and zeros otherwise (the request's first chunk, or a recompute after
preemption):

    out[t, d] = bias[d] + sum_k weight[d, k] * xpad[t + k, d]        (t = 0 .. L - 1)

then ``silu`` when ``activation == "silu"``. That is HF ``nn.Conv1d(groups=dim,
padding=width - 1)`` followed by ``[..., :L]`` on the whole sequence (``MambaMixer``'s
``causal_conv1d_fn``) when the request is run in one piece, and the same outputs when it is
run in chunks that carry the state. Afterwards the slot holds the last ``width - 1`` entries
of ``xpad`` (conv *inputs*, before activation, oldest first): with ``L < width - 1`` some of
them are the stored ones (or zeros).

State layout (the contract with the model's state cache): ``conv_state`` is ``[num_slots,
dim, width - 1]`` in the model dtype, any strides (a view of a larger buffer works). A request
with a negative slot (``PAD_SLOT_ID``, CUDA-graph padding) or no tokens is skipped: its state
is neither read nor written and its output rows are not written, like rows past
``query_start_loc[-1]``. Slots must be distinct within a call.

Arithmetic is float32 (products, sum, bias, silu), rounded once to ``x``'s dtype, as the
``causal-conv1d`` CUDA package that transformers uses when installed; HF's torch fallback
rounds the conv to the model dtype before silu, so bf16 outputs differ from it by an ulp.

``causal_conv1d_update`` is the decode step (one token per request, always continuing from
the stored state: HF's ``causal_conv1d_update``, vLLM's op of the same name).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from turnout.kernels._checks import (
    check_dtypes,
    check_flat,
    check_matrix,
    check_one_per_row,
    check_state_batch,
    check_vector,
    dtype_name,
)
from turnout.kernels._triton import require_triton, tl, triton

#: State index of a padding request: skipped (vLLM's ``PAD_SLOT_ID``).
PAD_SLOT_ID = -1
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ACTIVATIONS = (None, "silu")
# Tiles: BLOCK_T tokens x BLOCK_D channels per loop step; the same on CPU and GPU, so that the
# interpreted tests run the compiled variants' loops (several tiles, several channel blocks).
_BLOCK_T, _BLOCK_D = 16, 64
_BLOCK_D_UPDATE = 64


@triton.jit  # type: ignore[untyped-decorator]
def _causal_conv1d_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    weight_ptr,
    bias_ptr,
    conv_state_ptr,
    query_start_loc_ptr,
    state_indices_ptr,
    has_initial_state_ptr,
    out_ptr,
    x_stride_t,
    out_stride_t,
    weight_stride_d,
    state_stride_slot,
    state_stride_d,
    state_stride_k,
    dim,
    WIDTH: tl.constexpr,
    STATE_P: tl.constexpr,  # next power of two >= WIDTH - 1
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per (request, block of channels), looping over the request's tokens.
    req = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + req)
    seq_len = tl.load(query_start_loc_ptr + req + 1) - start
    slot = tl.load(state_indices_ptr + req)
    if (slot < 0) | (seq_len <= 0):  # padding request, or nothing scheduled
        return
    # Stored inputs have positions -(WIDTH - 1)..-1; without an initial state there are none
    # (zeros). An int bound, not a bool: the interpreter mistypes `tensor_mask & scalar_bool`.
    oldest = -(WIDTH - 1) * tl.load(has_initial_state_ptr + req).to(tl.int32)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < dim
    state_row = conv_state_ptr + slot.to(tl.int64) * state_stride_slot + d * state_stride_d
    bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
    for t_start in range(0, seq_len, BLOCK_T):
        t = t_start + tl.arange(0, BLOCK_T)
        t_mask = t < seq_len
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32) + bias[None, :]
        for k in tl.static_range(WIDTH):
            # xpad[t + k] is the request's input p = t + k - (WIDTH - 1); p < 0 is stored state
            p = t + (k - (WIDTH - 1))
            from_x = t_mask & (p >= 0)
            from_state = t_mask & (p < 0) & (p >= oldest)
            rows = (start + p).to(tl.int64)
            xv = tl.load(
                x_ptr + rows[:, None] * x_stride_t + d[None, :],
                mask=from_x[:, None] & d_mask[None, :],
                other=0.0,
            )
            sv = tl.load(
                state_row[None, :] + (p + (WIDTH - 1))[:, None] * state_stride_k,
                mask=from_state[:, None] & d_mask[None, :],
                other=0.0,
            )
            w = tl.load(weight_ptr + d * weight_stride_d + k, mask=d_mask, other=0.0).to(tl.float32)
            acc += w[None, :] * (xv.to(tl.float32) + sv.to(tl.float32))
        if SILU:
            acc = acc * tl.sigmoid(acc)
        out_rows = (start + t).to(tl.int64)
        tl.store(
            out_ptr + out_rows[:, None] * out_stride_t + d[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=t_mask[:, None] & d_mask[None, :],
        )
    # New state: the last WIDTH - 1 entries of xpad, i.e. inputs p = seq_len - (WIDTH - 1) + j.
    j = tl.arange(0, STATE_P)
    p = seq_len - (WIDTH - 1) + j
    j_mask = j < WIDTH - 1
    xv = tl.load(
        x_ptr + (start + p).to(tl.int64)[None, :] * x_stride_t + d[:, None],
        mask=d_mask[:, None] & (j_mask & (p >= 0))[None, :],
        other=0.0,
    )
    sv = tl.load(
        state_row[:, None] + (p + (WIDTH - 1))[None, :] * state_stride_k,
        mask=d_mask[:, None] & (j_mask & (p < 0) & (p >= oldest))[None, :],
        other=0.0,
    )
    new_state = xv.to(conv_state_ptr.dtype.element_ty) + sv
    # Entries move towards the front of the same row: every thread's reads of the old state
    # (above and in the loop) must be done before any thread overwrites one.
    tl.debug_barrier()
    tl.store(
        state_row[:, None] + j[None, :] * state_stride_k,
        new_state,
        mask=d_mask[:, None] & j_mask[None, :],
    )


def causal_conv1d(
    x: torch.Tensor,  # [num_tokens, dim] float32/float16/bfloat16, unit inner stride
    weight: torch.Tensor,  # [dim, width] x's dtype (HF Conv1d weight [dim, 1, width] squeezed)
    bias: torch.Tensor | None,  # [dim] x's dtype
    conv_state: torch.Tensor,  # [num_slots, dim, width - 1] x's dtype, read and updated in place
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    state_indices: torch.Tensor,  # [num_reqs] int32, batch position -> slot (< 0: skip)
    has_initial_state: torch.Tensor,  # [num_reqs] bool, False: start from zeros
    activation: str | None = "silu",  # "silu" or None
) -> torch.Tensor:  # [num_tokens, dim], x's dtype
    """Causal depthwise conv1d of a packed varlen batch, carrying each request's state
    (Triton). See the module docstring. Never synchronises with the device.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes, strides or ``activation`` do not match the annotations.
    """
    require_triton()
    _check_conv(x, weight, bias, conv_state, state_indices, activation)
    check_state_batch(query_start_loc, state_indices, has_initial_state)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_reqs, dim = state_indices.shape[0], x.shape[1]
    if num_reqs == 0 or x.shape[0] == 0:
        return out
    width = weight.shape[1]
    _causal_conv1d_kernel[(num_reqs, triton.cdiv(dim, _BLOCK_D))](
        x,
        weight,
        bias if bias is not None else weight,
        conv_state,
        query_start_loc,
        state_indices,
        has_initial_state,
        out,
        x.stride(0),
        out.stride(0),
        weight.stride(0),
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        dim,
        WIDTH=width,
        STATE_P=triton.next_power_of_2(width - 1),
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        BLOCK_T=_BLOCK_T,
        BLOCK_D=_BLOCK_D,
    )
    return out


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:  # [num_tokens, dim], x's dtype
    """Torch reference of :func:`causal_conv1d` (same arguments; what CPU runs use): one
    request at a time, ``F.conv1d`` in float32 over ``[prev ; x_i]``. Reads the batch's index
    arrays to the host.

    Raises:
        ValueError: as :func:`causal_conv1d`.
    """
    _check_conv(x, weight, bias, conv_state, state_indices, activation)
    check_state_batch(query_start_loc, state_indices, has_initial_state)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dim, keep = x.shape[1], weight.shape[1] - 1
    w = weight.float().unsqueeze(1)  # [dim, 1, width]
    b = bias.float() if bias is not None else None
    starts = query_start_loc.tolist()
    for i, (slot, init) in enumerate(
        zip(state_indices.tolist(), has_initial_state.tolist(), strict=True)
    ):
        start, end = starts[i], starts[i + 1]
        if slot < 0 or end <= start:
            continue
        prev = conv_state[slot].float() if init else x.new_zeros(dim, keep, dtype=torch.float32)
        xpad = torch.cat([prev, x[start:end].float().T], dim=1)  # [dim, keep + L]
        y = F.conv1d(xpad.unsqueeze(0), w, b, groups=dim).squeeze(0)  # [dim, L]
        out[start:end] = (F.silu(y) if activation == "silu" else y).T.to(out.dtype)
        conv_state[slot] = xpad[:, -keep:].to(conv_state.dtype)
    return out


@triton.jit  # type: ignore[untyped-decorator]
def _causal_conv1d_update_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    weight_ptr,
    bias_ptr,
    conv_state_ptr,
    state_indices_ptr,
    out_ptr,
    x_stride_t,
    out_stride_t,
    weight_stride_d,
    state_stride_slot,
    state_stride_d,
    state_stride_k,
    dim,
    WIDTH: tl.constexpr,
    STATE_P: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per (request, block of channels); one token each.
    req = tl.program_id(0)
    slot = tl.load(state_indices_ptr + req)
    if slot < 0:  # padding request of a CUDA-graph batch
        return
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < dim
    j = tl.arange(0, STATE_P)
    j_mask = j < WIDTH - 1
    mask = d_mask[:, None] & j_mask[None, :]
    state_row = conv_state_ptr + slot.to(tl.int64) * state_stride_slot + d * state_stride_d
    prev = tl.load(state_row[:, None] + j[None, :] * state_stride_k, mask=mask, other=0.0)
    x = tl.load(x_ptr + req.to(tl.int64) * x_stride_t + d, mask=d_mask, other=0.0)
    w_prev = tl.load(weight_ptr + d[:, None] * weight_stride_d + j[None, :], mask=mask, other=0.0)
    w_last = tl.load(weight_ptr + d * weight_stride_d + (WIDTH - 1), mask=d_mask, other=0.0)
    acc = tl.sum(prev.to(tl.float32) * w_prev.to(tl.float32), axis=1)
    acc += w_last.to(tl.float32) * x.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(
        out_ptr + req.to(tl.int64) * out_stride_t + d, acc.to(out_ptr.dtype.element_ty), mask=d_mask
    )
    # Shift left by one and append x: new[j] = prev[j + 1], new[WIDTH - 2] = x.
    shifted = tl.load(
        state_row[:, None] + (j + 1)[None, :] * state_stride_k,
        mask=d_mask[:, None] & (j + 1 < WIDTH - 1)[None, :],
        other=0.0,
    )
    new_state = tl.where((j == WIDTH - 2)[None, :], x[:, None].to(shifted.dtype), shifted)
    tl.debug_barrier()  # all reads of the row before any write (entries move within it)
    tl.store(state_row[:, None] + j[None, :] * state_stride_k, new_state, mask=mask)


def causal_conv1d_update(
    x: torch.Tensor,  # [num_reqs, dim] float32/float16/bfloat16, unit inner stride
    weight: torch.Tensor,  # [dim, width] x's dtype
    bias: torch.Tensor | None,  # [dim] x's dtype
    conv_state: torch.Tensor,  # [num_slots, dim, width - 1] x's dtype, updated in place
    state_indices: torch.Tensor,  # [num_reqs] int32, request -> slot (< 0: skip)
    activation: str | None = "silu",  # "silu" or None
) -> torch.Tensor:  # [num_reqs, dim], x's dtype
    """One decode token per request, continuing from the stored state (Triton): ``out =
    act(bias + weight[:, :-1] . prev + weight[:, -1] * x)``, then the state shifts by one and
    takes ``x``. Rows of skipped (negative-slot) requests are not written.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes, strides or ``activation`` do not match the annotations.
    """
    require_triton()
    _check_conv(x, weight, bias, conv_state, state_indices, activation)
    check_one_per_row("state_indices", state_indices, "x", x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_reqs, dim = x.shape
    if num_reqs == 0:
        return out
    width = weight.shape[1]
    _causal_conv1d_update_kernel[(num_reqs, triton.cdiv(dim, _BLOCK_D_UPDATE))](
        x,
        weight,
        bias if bias is not None else weight,
        conv_state,
        state_indices,
        out,
        x.stride(0),
        out.stride(0),
        weight.stride(0),
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        dim,
        WIDTH=width,
        STATE_P=triton.next_power_of_2(width - 1),
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        BLOCK_D=_BLOCK_D_UPDATE,
    )
    return out


def causal_conv1d_update_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:  # [num_reqs, dim], x's dtype
    """Torch reference of :func:`causal_conv1d_update` (same arguments), float32 arithmetic.
    Selects the non-padding requests with a boolean mask (syncs on CUDA).

    Raises:
        ValueError: as :func:`causal_conv1d_update`.
    """
    _check_conv(x, weight, bias, conv_state, state_indices, activation)
    check_one_per_row("state_indices", state_indices, "x", x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = torch.nonzero(state_indices >= 0).flatten()
    slots = state_indices[rows].long()
    xpad = torch.cat(
        [conv_state[slots].float(), x[rows].float().unsqueeze(2)], dim=2
    )  # [n, dim, width]
    y = (xpad * weight.float()).sum(dim=2)
    if bias is not None:
        y = y + bias.float()
    out[rows] = (F.silu(y) if activation == "silu" else y).to(out.dtype)
    conv_state[slots] = xpad[:, :, 1:].to(conv_state.dtype)
    return out


def _check_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    activation: str | None,
) -> None:
    check_flat(state_indices=state_indices)
    check_dtypes(state_indices=(state_indices, torch.int32))
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {dtype_name(x.dtype)}")
    check_matrix("x", x, x.dtype, "[num_tokens, dim]")
    dim = x.shape[1]
    check_matrix("weight", weight, x.dtype, "[dim, width]", num_rows=dim)
    if weight.shape[1] < 2:
        raise ValueError(
            f"weight must have width >= 2 (a state of width - 1 inputs), got {tuple(weight.shape)}"
        )
    if bias is not None:
        check_vector("bias", bias, x.dtype, dim)
    want = f"[num_slots, {dim}, {weight.shape[1] - 1}] {dtype_name(x.dtype)}"
    if (
        conv_state.dim() != 3
        or tuple(conv_state.shape[1:]) != (dim, weight.shape[1] - 1)
        or conv_state.dtype != x.dtype
    ):
        raise ValueError(
            f"conv_state must be {want} (dim, width - 1), got "
            f"{tuple(conv_state.shape)} {dtype_name(conv_state.dtype)}"
        )
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")


__all__ = [
    "PAD_SLOT_ID",
    "causal_conv1d",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
]
