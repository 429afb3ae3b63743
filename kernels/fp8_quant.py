"""FP8 (e4m3) activation quantisation for W8A8 GEMMs, in one launch.

Each ``(row, group)`` program reads ``group_size`` channels of one token, finds their absolute
maximum, and writes ``q = clamp(x / s, -448, 448)`` rounded to ``float8_e4m3fn`` with
``s = max(amax / 448, 1e-12)`` (dynamic), or with the given static scale ``s``. Groups:

- per token (``group_size = K``): the scales are ``[M_pad, 1]`` (``torch._scaled_mm``'s
  row-wise ``scale_a``);
- per 1x128 tile (``group_size = 128``, DeepSeek-V3's activation tiles): the scales are
  ``[M_pad, K / 128]`` outer-dim-major (strides ``(1, M_pad)``), the layout
  ``F.scaled_mm``'s ``BlockWise1x128`` recipe reads.

``M_pad`` rounds the rows up to ``pad_rows_to`` (cuBLASLt wants 16-byte aligned scale
columns for block scaling, so 4 float32 rows); padding rows quantise zeros (scale 1e-12).
The torch ops this replaces took 7 launches (80-130 us at M = 1 on an H200, more than the
GEMM itself); this is one.

``quantize_fp8`` is the Triton launcher; ``quantize_fp8_ref`` the torch reference (same
arithmetic: float32, IEEE division, round to nearest even). On the H200 scales and normal codes
agree bit for bit; Triton's conversion rounds some e4m3 subnormal ties the other way (one
subnormal step, 2^-9 of the scale; tests/kernels/test_fp8_quant.py).
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_dtypes
from turnout.kernels._triton import require_triton, tl, triton

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1e-12


@triton.jit  # type: ignore[untyped-decorator]
def _quantize_fp8_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    x_stride,
    q_ptr,
    q_stride,
    scale_ptr,
    scale_stride_row,
    scale_stride_group,
    static_scale_ptr,
    num_rows,
    GROUP_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    STATIC: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    # Padding rows (row >= num_rows) read nothing: they quantise zeros.
    limit = tl.where(row < num_rows, GROUP_SIZE, 0)
    x_row = x_ptr + row.to(tl.int64) * x_stride + group * GROUP_SIZE
    q_row = q_ptr + row.to(tl.int64) * q_stride + group * GROUP_SIZE
    if STATIC:
        s = tl.load(static_scale_ptr)
    else:
        amax = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for start in range(0, GROUP_SIZE, BLOCK_SIZE):
            offs = start + tl.arange(0, BLOCK_SIZE)
            x = tl.load(x_row + offs, mask=offs < limit, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        s = tl.maximum(tl.fdiv(tl.max(amax, axis=0), 448.0, ieee_rounding=True), 1e-12)
    for start in range(0, GROUP_SIZE, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_row + offs, mask=offs < limit, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.fdiv(x, s, ieee_rounding=True), -448.0), 448.0)
        tl.store(q_row + offs, q.to(q_ptr.dtype.element_ty), mask=offs < GROUP_SIZE)
    tl.store(scale_ptr + row * scale_stride_row + group * scale_stride_group, s)


def _outputs(
    x: torch.Tensor, group_size: int, pad_rows_to: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    m, k = x.shape
    m_pad = -(-m // pad_rows_to) * pad_rows_to
    q = torch.empty(m_pad, k, dtype=FP8_DTYPE, device=x.device)
    num_groups = k // group_size
    # Per token: [M_pad, 1]; per tile: [M_pad, groups] with strides (1, M_pad).
    scale = torch.empty(num_groups, m_pad, dtype=torch.float32, device=x.device).t()
    return q, scale, num_groups


def _check(x: torch.Tensor, group_size: int | None, static_scale: torch.Tensor | None) -> int:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(
            f"x must be [M, K] with unit inner stride, got shape {tuple(x.shape)}, strides {x.stride()}"
        )
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    group = x.shape[1] if group_size is None else group_size
    if group <= 0 or x.shape[1] % group:
        raise ValueError(f"group_size {group_size} must divide K = {x.shape[1]}")
    if static_scale is not None:
        check_dtypes(static_scale=(static_scale, torch.float32))
        if static_scale.numel() != 1 or group_size is not None:
            raise ValueError(
                "static_scale is one float32 scale, for per-token groups (group_size None)"
            )
    return group


def quantize_fp8(
    x: torch.Tensor,  # [M, K] bfloat16/float16/float32, unit inner stride
    *,
    group_size: int | None = None,  # None: per token; else channels per group (K % group == 0)
    static_scale: torch.Tensor | None = None,  # [] or [1] float32: one scale for every token
    pad_rows_to: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M_pad, K] float8_e4m3fn, [M_pad, K / group] float32
    """FP8 quantisation of ``x`` (module docstring), one Triton launch.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: bad dtypes, shapes or group size.
    """
    require_triton()
    group = _check(x, group_size, static_scale)
    q, scale, num_groups = _outputs(x, group, pad_rows_to)
    block = min(triton.next_power_of_2(group), 1024)
    grid = (q.shape[0], num_groups)
    dummy = static_scale if static_scale is not None else scale
    _quantize_fp8_kernel[grid](
        x,
        x.stride(0),
        q,
        q.stride(0),
        scale,
        scale.stride(0),
        scale.stride(1),
        dummy,
        x.shape[0],
        GROUP_SIZE=group,
        BLOCK_SIZE=block,
        STATIC=static_scale is not None,
        num_warps=4 if block >= 512 else 1,
    )
    return q, scale


def quantize_fp8_ref(
    x: torch.Tensor,
    *,
    group_size: int | None = None,
    static_scale: torch.Tensor | None = None,
    pad_rows_to: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`quantize_fp8` (same outputs, shapes and layouts).

    Raises:
        ValueError: bad dtypes, shapes or group size.
    """
    group = _check(x, group_size, static_scale)
    q, scale, num_groups = _outputs(x, group, pad_rows_to)
    m, k = x.shape
    xf = torch.zeros(q.shape[0], k, dtype=torch.float32, device=x.device)
    xf[:m] = x.float()
    xg = xf.view(q.shape[0], num_groups, group)
    if static_scale is not None:
        s = static_scale.float().reshape(1, 1).expand(q.shape[0], 1)
    else:
        s = (xg.abs().amax(dim=-1) / FP8_MAX).clamp(min=MIN_SCALE)
    q.copy_((xg / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(q.shape[0], k))
    scale.copy_(s)
    return q, scale


__all__ = ["FP8_DTYPE", "FP8_MAX", "MIN_SCALE", "quantize_fp8", "quantize_fp8_ref"]
