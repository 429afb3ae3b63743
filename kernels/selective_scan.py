"""Mamba-1 selective scan (Gu & Dao 2023, arXiv:2312.00752, Algorithm 2) over packed (varlen)
requests, with a per-request SSM state.

Per request (tokens ``query_start_loc[i]:query_start_loc[i + 1]``, slot ``state_indices[i]``),
starting from the slot's state when ``has_initial_state[i]`` and from zeros otherwise, for
each token ``t`` and channel ``d`` (all float32):

    delta = softplus(dt[t, d] + dt_bias[d])          (no softplus if delta_softplus=False)
    h[d, :] = exp(delta * A[d, :]) * h[d, :] + delta * x[t, d] * B[t, :]
    y[t, d] = h[d, :] . C[t, :] + D[d] * x[t, d]
    y[t, d] *= silu(z[t, d])

and the slot keeps the final ``h``. This is HF ``MambaMixer``'s recurrence
(``mamba_selective_scan`` / ``slow_forward``, and ``mamba_selective_state_update`` for one
token) with every step in float32, as the ``mamba_ssm`` CUDA kernels that transformers uses
when installed; HF's torch fallback applies the softplus in the model dtype and rounds
``h . C`` to it (in decode also ``D * x`` and the gate), so bf16/fp16 outputs differ from it by
rounding (float32 is the same computation).

State layout (the contract with the model's state cache): ``ssm_state`` is ``[num_slots, dim,
d_state]`` float32 with a unit inner stride (a view of a larger buffer works). A request with a
negative slot (``PAD_SLOT_ID``, CUDA-graph padding) or no tokens is skipped: its state is
neither read nor written and its output rows are not written, like rows past
``query_start_loc[-1]``. Slots must be distinct within a call.

Prefill (``selective_scan``): one program per (request, ``BLOCK_D`` channels) keeps the state
``[BLOCK_D, d_state]`` in registers from the slot's read to its one write, and walks the
request's tokens ``CHUNK`` at a time, unrolled: the chunk's loads of x, dt, z, B and C do not
depend on the state, so they are issued together ahead of the recurrence, whose only serial
step per token is one multiply-add per state entry (``exp(delta A)`` and ``delta x B`` are
computed off the chain). A parallel scan over the chunk (``tl.associative_scan``) would
shorten the chain further but runs element by element in Triton's interpreter, which the CPU
suite uses. Decode (``selective_state_update``): the same step once per request, one program
per (request, block of channels), bound by the state's read and write.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from turnout.kernels.causal_conv1d import PAD_SLOT_ID

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BLOCK_D_UPDATE = 64


@dataclass(frozen=True)
class ScanBlockConfig:
    """Tiles of one ``selective_scan`` call: ``block_d`` channels per program, ``chunk`` tokens
    per loop step (both powers of two). The default is the fastest tile of
    ``benchmarks/selective_scan.py``'s sweep on the H200 (Mamba-130m, 8 x 2048 tokens in bf16:
    1.63 ms against 1.93 ms for 32 channels and 4 warps; docs/benchmarks.md): the recurrence is
    sequential in the tokens, so more, narrower programs hide more of its latency."""

    block_d: int = 16
    chunk: int = 8
    num_warps: int = 2

    def __post_init__(self) -> None:
        for name in ("block_d", "chunk", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"ScanBlockConfig.{name} must be a power of two, got {value}")


@triton.jit
def _softplus(x):  # type: ignore[no-untyped-def]
    # torch's softplus (threshold 20): log1p(exp(x)), with log1p(u) = u * log(1 + u) / ((1 + u) - 1)
    # (Goldberg 1991) so that exp(x) below float32's epsilon is not lost against the 1.
    u = tl.exp(x)
    v = 1.0 + u
    exact = v == 1.0
    log1p = tl.where(exact, u, tl.log(v) * (u / tl.where(exact, 1.0, v - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit  # type: ignore[untyped-decorator]
def _channel_params(  # type: ignore[no-untyped-def]
    A_ptr,
    D_ptr,
    dt_bias_ptr,
    A_stride_d,
    d,
    n,
    d_mask,
    dn_mask,
    HAS_D: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
):
    # Per-channel constants: A2 = A * log2(e) [BLOCK_D, D_STATE_P] (exp(delta A) is computed as
    # exp2(delta A2)), dt_bias and D [BLOCK_D] (zeros when absent).
    A2 = (
        tl.load(A_ptr + d[:, None] * A_stride_d + n[None, :], mask=dn_mask, other=0.0)
        * 1.4426950408889634
    )
    dt_bias = tl.zeros(d.shape, dtype=tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + d, mask=d_mask, other=0.0)
    skip = tl.zeros(d.shape, dtype=tl.float32)
    if HAS_D:
        skip = tl.load(D_ptr + d, mask=d_mask, other=0.0)
    return A2, dt_bias, skip


@triton.jit  # type: ignore[untyped-decorator]
def _ssm_step(  # type: ignore[no-untyped-def]
    h,
    row,
    x_ptr,
    dt_ptr,
    B_ptr,
    C_ptr,
    z_ptr,
    out_ptr,
    x_stride_t,
    dt_stride_t,
    B_stride_t,
    C_stride_t,
    z_stride_t,
    out_stride_t,
    d,
    n,
    d_mask,
    n_mask,
    A2,
    dt_bias,
    skip,
    HAS_Z: tl.constexpr,
    DELTA_SOFTPLUS: tl.constexpr,
):
    # One token (packed row `row`, int64) for BLOCK_D channels: writes y, returns the new state.
    x = tl.load(x_ptr + row * x_stride_t + d, mask=d_mask, other=0.0).to(tl.float32)
    delta = tl.load(dt_ptr + row * dt_stride_t + d, mask=d_mask, other=0.0).to(tl.float32) + dt_bias
    if DELTA_SOFTPLUS:
        delta = _softplus(delta)
    Bt = tl.load(B_ptr + row * B_stride_t + n, mask=n_mask, other=0.0).to(tl.float32)
    Ct = tl.load(C_ptr + row * C_stride_t + n, mask=n_mask, other=0.0).to(tl.float32)
    # exp(delta * A) as exp2 (A2 = A * log2(e)); only the FMA below is on the chain through h
    h = tl.exp2(delta[:, None] * A2) * h + (delta * x)[:, None] * Bt[None, :]
    y = tl.sum(h * Ct[None, :], axis=1) + skip * x
    if HAS_Z:
        z = tl.load(z_ptr + row * z_stride_t + d, mask=d_mask, other=0.0).to(tl.float32)
        y = y * (z * tl.sigmoid(z))
    tl.store(out_ptr + row * out_stride_t + d, y.to(out_ptr.dtype.element_ty), mask=d_mask)
    return h


@triton.jit  # type: ignore[untyped-decorator]
def _selective_scan_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    dt_bias_ptr,
    ssm_state_ptr,
    query_start_loc_ptr,
    state_indices_ptr,
    has_initial_state_ptr,
    out_ptr,
    x_stride_t,
    dt_stride_t,
    B_stride_t,
    C_stride_t,
    z_stride_t,
    out_stride_t,
    A_stride_d,
    state_stride_slot,
    state_stride_d,
    dim,
    D_STATE: tl.constexpr,
    D_STATE_P: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DELTA_SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
):
    req = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + req)
    seq_len = tl.load(query_start_loc_ptr + req + 1) - start
    slot = tl.load(state_indices_ptr + req)
    if (slot < 0) | (seq_len <= 0):  # padding request, or nothing scheduled
        return
    init = tl.load(has_initial_state_ptr + req).to(tl.int32)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, D_STATE_P)
    d_mask, n_mask = d < dim, n < D_STATE
    dn_mask = d_mask[:, None] & n_mask[None, :]
    state = (
        ssm_state_ptr
        + slot.to(tl.int64) * state_stride_slot
        + d[:, None] * state_stride_d
        + n[None, :]
    )
    # Broadcast first: the interpreter mistypes `tensor_mask & scalar_bool`.
    stored = (tl.zeros([BLOCK_D, D_STATE_P], dtype=tl.int32) + init) != 0
    h = tl.load(state, mask=dn_mask & stored, other=0.0)  # [BLOCK_D, D_STATE_P] float32
    A2, dt_bias, skip = _channel_params(
        A_ptr, D_ptr, dt_bias_ptr, A_stride_d, d, n, d_mask, dn_mask, HAS_D, HAS_DT_BIAS
    )
    first = start.to(tl.int64)
    num_full = seq_len // CHUNK * CHUNK
    for t_start in range(0, num_full, CHUNK):
        # CHUNK tokens unrolled: their loads do not depend on the state, so they are issued
        # together, ahead of the recurrence.
        for i in tl.static_range(CHUNK):
            h = _ssm_step(
                h,
                first + t_start + i,
                x_ptr,
                dt_ptr,
                B_ptr,
                C_ptr,
                z_ptr,
                out_ptr,
                x_stride_t,
                dt_stride_t,
                B_stride_t,
                C_stride_t,
                z_stride_t,
                out_stride_t,
                d,
                n,
                d_mask,
                n_mask,
                A2,
                dt_bias,
                skip,
                HAS_Z,
                DELTA_SOFTPLUS,
            )
    for t in range(num_full, seq_len):  # the last seq_len % CHUNK tokens
        h = _ssm_step(
            h,
            first + t,
            x_ptr,
            dt_ptr,
            B_ptr,
            C_ptr,
            z_ptr,
            out_ptr,
            x_stride_t,
            dt_stride_t,
            B_stride_t,
            C_stride_t,
            z_stride_t,
            out_stride_t,
            d,
            n,
            d_mask,
            n_mask,
            A2,
            dt_bias,
            skip,
            HAS_Z,
            DELTA_SOFTPLUS,
        )
    tl.store(state, h, mask=dn_mask)


def selective_scan(
    x: torch.Tensor,  # [num_tokens, dim] float32/float16/bfloat16 (the conv output u), unit inner stride
    dt: torch.Tensor,  # [num_tokens, dim] x's dtype (dt_proj output, before softplus)
    A: torch.Tensor,  # [dim, d_state] float32 (= -exp(A_log))
    B: torch.Tensor,  # [num_tokens, d_state] x's dtype
    C: torch.Tensor,  # [num_tokens, d_state] x's dtype
    D: torch.Tensor | None,  # [dim] float32 skip
    z: torch.Tensor | None,  # [num_tokens, dim] x's dtype, gate: y *= silu(z)
    dt_bias: torch.Tensor | None,  # [dim] float32, added to dt before softplus
    ssm_state: torch.Tensor,  # [num_slots, dim, d_state] float32, read and updated in place
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    state_indices: torch.Tensor,  # [num_reqs] int32, batch position -> slot (< 0: skip)
    has_initial_state: torch.Tensor,  # [num_reqs] bool, False: start from zeros
    delta_softplus: bool = True,
    *,
    block_config: ScanBlockConfig | None = None,  # default: ScanBlockConfig()
) -> torch.Tensor:  # [num_tokens, dim], x's dtype
    """Selective scan of a packed varlen batch, carrying each request's SSM state (Triton).
    See the module docstring. Never synchronises with the device.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    require_triton()
    _check_scan(x, dt, A, B, C, D, z, dt_bias, ssm_state, state_indices)
    check_state_batch(query_start_loc, state_indices, has_initial_state)
    cfg = block_config or ScanBlockConfig()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_reqs, (dim, d_state) = state_indices.shape[0], A.shape
    if num_reqs == 0 or x.shape[0] == 0:
        return out
    _selective_scan_kernel[(num_reqs, triton.cdiv(dim, cfg.block_d))](
        x,
        dt,
        A,
        B,
        C,
        _or(D, A),
        _or(z, x),
        _or(dt_bias, A),
        ssm_state,
        query_start_loc,
        state_indices,
        has_initial_state,
        out,
        x.stride(0),
        dt.stride(0),
        B.stride(0),
        C.stride(0),
        z.stride(0) if z is not None else 0,
        out.stride(0),
        A.stride(0),
        ssm_state.stride(0),
        ssm_state.stride(1),
        dim,
        D_STATE=d_state,
        D_STATE_P=triton.next_power_of_2(d_state),
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DELTA_SOFTPLUS=bool(delta_softplus),
        BLOCK_D=cfg.block_d,
        CHUNK=cfg.chunk,
        num_warps=cfg.num_warps,
    )
    return out


def selective_scan_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    delta_softplus: bool = True,
    *,
    block_config: ScanBlockConfig | None = None,  # unused; kept so both take the same arguments
) -> torch.Tensor:  # [num_tokens, dim], x's dtype
    """Torch reference of :func:`selective_scan` (what CPU runs use): one request at a time,
    the recurrence token by token in float32. Reads the batch's index arrays to the host.

    Raises:
        ValueError: as :func:`selective_scan`.
    """
    del block_config
    _check_scan(x, dt, A, B, C, D, z, dt_bias, ssm_state, state_indices)
    check_state_batch(query_start_loc, state_indices, has_initial_state)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    starts = query_start_loc.tolist()
    for i, (slot, init) in enumerate(
        zip(state_indices.tolist(), has_initial_state.tolist(), strict=True)
    ):
        start, end = starts[i], starts[i + 1]
        if slot < 0 or end <= start:
            continue
        span = slice(start, end)
        delta = _delta(dt[span], dt_bias, delta_softplus)  # [L, dim]
        u, Bs, Cs = x[span].float(), B[span].float(), C[span].float()
        h = ssm_state[slot].clone() if init else torch.zeros_like(ssm_state[slot])
        y = torch.empty_like(u)
        for t in range(end - start):  # [dim, d_state] at a time: memory stays O(state)
            h = torch.exp(delta[t, :, None] * A) * h + (delta[t] * u[t])[:, None] * Bs[t]
            y[t] = h @ Cs[t]
        out[span] = _output(y, u, D, z[span] if z is not None else None).to(out.dtype)
        ssm_state[slot] = h
    return out


@triton.jit  # type: ignore[untyped-decorator]
def _selective_state_update_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    dt_bias_ptr,
    ssm_state_ptr,
    state_indices_ptr,
    out_ptr,
    x_stride_t,
    dt_stride_t,
    B_stride_t,
    C_stride_t,
    z_stride_t,
    out_stride_t,
    A_stride_d,
    state_stride_slot,
    state_stride_d,
    dim,
    D_STATE: tl.constexpr,
    D_STATE_P: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DELTA_SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0)
    slot = tl.load(state_indices_ptr + req)
    if slot < 0:  # padding request of a CUDA-graph batch
        return
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, D_STATE_P)
    d_mask, n_mask = d < dim, n < D_STATE
    dn_mask = d_mask[:, None] & n_mask[None, :]
    state = (
        ssm_state_ptr
        + slot.to(tl.int64) * state_stride_slot
        + d[:, None] * state_stride_d
        + n[None, :]
    )
    h = tl.load(state, mask=dn_mask, other=0.0)
    A2, dt_bias, skip = _channel_params(
        A_ptr, D_ptr, dt_bias_ptr, A_stride_d, d, n, d_mask, dn_mask, HAS_D, HAS_DT_BIAS
    )
    h = _ssm_step(
        h,
        req.to(tl.int64),
        x_ptr,
        dt_ptr,
        B_ptr,
        C_ptr,
        z_ptr,
        out_ptr,
        x_stride_t,
        dt_stride_t,
        B_stride_t,
        C_stride_t,
        z_stride_t,
        out_stride_t,
        d,
        n,
        d_mask,
        n_mask,
        A2,
        dt_bias,
        skip,
        HAS_Z,
        DELTA_SOFTPLUS,
    )
    tl.store(state, h, mask=dn_mask)


def selective_state_update(
    x: torch.Tensor,  # [num_reqs, dim] float32/float16/bfloat16, unit inner stride
    dt: torch.Tensor,  # [num_reqs, dim] x's dtype (before softplus)
    A: torch.Tensor,  # [dim, d_state] float32
    B: torch.Tensor,  # [num_reqs, d_state] x's dtype
    C: torch.Tensor,  # [num_reqs, d_state] x's dtype
    D: torch.Tensor | None,  # [dim] float32
    z: torch.Tensor | None,  # [num_reqs, dim] x's dtype
    dt_bias: torch.Tensor | None,  # [dim] float32
    ssm_state: torch.Tensor,  # [num_slots, dim, d_state] float32, updated in place
    state_indices: torch.Tensor,  # [num_reqs] int32, request -> slot (< 0: skip)
    delta_softplus: bool = True,
) -> torch.Tensor:  # [num_reqs, dim], x's dtype
    """One decode step per request, continuing from the stored state (Triton): the recurrence
    of the module docstring for a single token. Rows of skipped requests are not written.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    require_triton()
    _check_scan(x, dt, A, B, C, D, z, dt_bias, ssm_state, state_indices)
    check_one_per_row("state_indices", state_indices, "x", x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_reqs, (dim, d_state) = x.shape[0], A.shape
    if num_reqs == 0:
        return out
    _selective_state_update_kernel[(num_reqs, triton.cdiv(dim, _BLOCK_D_UPDATE))](
        x,
        dt,
        A,
        B,
        C,
        _or(D, A),
        _or(z, x),
        _or(dt_bias, A),
        ssm_state,
        state_indices,
        out,
        x.stride(0),
        dt.stride(0),
        B.stride(0),
        C.stride(0),
        z.stride(0) if z is not None else 0,
        out.stride(0),
        A.stride(0),
        ssm_state.stride(0),
        ssm_state.stride(1),
        dim,
        D_STATE=d_state,
        D_STATE_P=triton.next_power_of_2(d_state),
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DELTA_SOFTPLUS=bool(delta_softplus),
        BLOCK_D=_BLOCK_D_UPDATE,
    )
    return out


def selective_state_update_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    ssm_state: torch.Tensor,
    state_indices: torch.Tensor,
    delta_softplus: bool = True,
) -> torch.Tensor:  # [num_reqs, dim], x's dtype
    """Torch reference of :func:`selective_state_update` (same arguments), float32.
    Selects the non-padding requests with a boolean mask (syncs on CUDA).

    Raises:
        ValueError: as :func:`selective_state_update`.
    """
    _check_scan(x, dt, A, B, C, D, z, dt_bias, ssm_state, state_indices)
    check_one_per_row("state_indices", state_indices, "x", x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = torch.nonzero(state_indices >= 0).flatten()
    slots = state_indices[rows].long()
    delta = _delta(dt[rows], dt_bias, delta_softplus)  # [n, dim]
    u = x[rows].float()
    h = torch.exp(delta.unsqueeze(2) * A) * ssm_state[slots] + (delta * u).unsqueeze(2) * B[
        rows
    ].float().unsqueeze(1)
    ssm_state[slots] = h
    y = (h @ C[rows].float().unsqueeze(2)).squeeze(2)
    out[rows] = _output(y, u, D, z[rows] if z is not None else None).to(out.dtype)
    return out


def _delta(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool) -> torch.Tensor:
    delta = dt.float() + (dt_bias if dt_bias is not None else 0.0)
    return F.softplus(delta) if softplus else delta


def _output(
    y: torch.Tensor, u: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None
) -> torch.Tensor:
    # float32: y = h . C, then + D * u and * silu(z)
    if D is not None:
        y = y + D * u
    return y * F.silu(z.float()) if z is not None else y


def _or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """A pointer for an absent optional input (the kernel never reads it)."""
    return t if t is not None else placeholder


def _check_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    ssm_state: torch.Tensor,
    state_indices: torch.Tensor,
) -> None:
    check_flat(state_indices=state_indices)
    check_dtypes(state_indices=(state_indices, torch.int32))
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {dtype_name(x.dtype)}")
    check_matrix("x", x, x.dtype, "[num_tokens, dim]")
    num_tokens, dim = x.shape
    check_matrix("A", A, torch.float32, "[dim, d_state]", num_rows=dim)
    d_state = A.shape[1]
    check_matrix("dt", dt, x.dtype, "[num_tokens, dim]", num_rows=num_tokens, num_cols=dim)
    check_matrix("B", B, x.dtype, "[num_tokens, d_state]", num_rows=num_tokens, num_cols=d_state)
    check_matrix("C", C, x.dtype, "[num_tokens, d_state]", num_rows=num_tokens, num_cols=d_state)
    if z is not None:
        check_matrix("z", z, x.dtype, "[num_tokens, dim]", num_rows=num_tokens, num_cols=dim)
    if D is not None:
        check_vector("D", D, torch.float32, dim)
    if dt_bias is not None:
        check_vector("dt_bias", dt_bias, torch.float32, dim)
    if (
        ssm_state.dim() != 3
        or tuple(ssm_state.shape[1:]) != (dim, d_state)
        or ssm_state.dtype != torch.float32
        or ssm_state.stride(2) != 1
    ):
        raise ValueError(
            f"ssm_state must be [num_slots, {dim}, {d_state}] float32 (dim, d_state) "
            f"with unit inner stride, got {tuple(ssm_state.shape)} "
            f"{dtype_name(ssm_state.dtype)}, strides {ssm_state.stride()}"
        )


__all__ = [
    "PAD_SLOT_ID",
    "ScanBlockConfig",
    "selective_scan",
    "selective_scan_ref",
    "selective_state_update",
    "selective_state_update_ref",
]
