"""RMSNorm (Zhang & Sennrich 2019) in one kernel, optionally fused with the residual add before it.

A decoder layer's ``residual + branch`` followed by ``RMSNorm`` is, in torch, an add and about
seven elementwise/reduce kernels (cast, square, mean, add eps, rsqrt, multiply, cast, multiply
by the weight), each a round trip through HBM; here it is one read of each input and one write
of each output (vLLM's ``fused_add_rms_norm``, csrc/layernorm_kernels.cu).

Numerics are HF ``LlamaRMSNorm``'s: the sum ``x + residual`` is rounded to the input dtype
first (HF adds in the model dtype), the mean of squares and ``rsqrt`` are float32, the normalised
value is cast to the input dtype and then multiplied by the weight in that dtype. Only the order
of the float32 reduction differs from torch's.

Rows are addressed ``[num_tokens, num_heads, hidden]`` with any strides on the first two
dimensions and unit stride on the last, so Qwen3's per-head q/k norm reads the q and k parts of
the fused QKV projection in place (``num_heads`` heads of ``head_dim``); a hidden-state norm is
the case ``num_heads == 1``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import dtype_name
from turnout.kernels._triton import require_triton, tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    x_stride_t,
    x_stride_h,
    residual_ptr,
    residual_stride_t,
    weight_ptr,
    out_ptr,
    num_heads,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per (token, head) row; the whole row sits in registers (BLOCK_SIZE >= hidden).
    row = tl.program_id(0)
    tok = (row // num_heads).to(tl.int64)
    head = (row % num_heads).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < hidden_size
    x = tl.load(x_ptr + tok * x_stride_t + head * x_stride_h + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # HF adds in the model dtype: round the sum before normalising it, and keep it.
        res_ptrs = residual_ptr + tok * residual_stride_t + offs
        summed = x.to(tl.float32) + tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
        x = summed.to(x.dtype)
        tl.store(res_ptrs, x, mask=mask)
    h = x.to(tl.float32)
    mean_sq = tl.sum(h * h, axis=0) / hidden_size
    normed = (h * tl.math.rsqrt(mean_sq + eps)).to(x.dtype)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    out = (normed.to(tl.float32) * w.to(tl.float32)).to(x.dtype)
    tl.store(out_ptr + row.to(tl.int64) * hidden_size + offs, out, mask=mask)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] or [num_tokens, num_heads, head_dim]; unit last stride
    weight: torch.Tensor,  # [hidden] (or [head_dim]), x's dtype
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden] contiguous rows, updated in place
) -> torch.Tensor:  # x's shape, contiguous, x's dtype
    """``RMSNorm(x + residual) * weight`` in one Triton kernel; with ``residual`` given, the
    sum ``x + residual`` (rounded to x's dtype) is written back into ``residual``.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations (named).
    """
    require_triton()
    x3 = _check(x, weight, residual)
    num_tokens, num_heads, hidden = x3.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    _rms_norm_kernel[(num_tokens * num_heads,)](
        x3,
        x3.stride(0),
        x3.stride(1),
        residual if residual is not None else x3,
        residual.stride(0) if residual is not None else 0,
        weight,
        out,
        num_heads,
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_SIZE=triton.next_power_of_2(hidden),
        num_warps=_num_warps(hidden),
    )
    return out


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference of :func:`rms_norm` (HF ``LlamaRMSNorm`` after HF's residual add)."""
    _check(x, weight, residual)
    if residual is not None:
        residual.copy_(x + residual)
        x = residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h.to(x.dtype)).contiguous()


def _num_warps(hidden: int) -> int:
    # One warp per 256 elements of the row, 1..8 (a 1,024-wide row: 4 warps).
    warps: int = max(1, min(8, triton.next_power_of_2(hidden) // 256))
    return warps


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    if x.dim() not in (2, 3):
        raise ValueError(
            f"x must be [num_tokens, hidden] or [num_tokens, num_heads, head_dim], "
            f"got shape {tuple(x.shape)}"
        )
    x3 = x.unsqueeze(1) if x.dim() == 2 else x
    if x3.shape[-1] and x3.stride(-1) != 1:
        raise ValueError(f"x must have unit stride on its last dimension, got strides {x.stride()}")
    if weight.shape != (x3.shape[-1],) or weight.dtype != x.dtype:
        raise ValueError(
            f"weight must be [{x3.shape[-1]}] {dtype_name(x.dtype)}, got "
            f"{list(weight.shape)} {dtype_name(weight.dtype)}"
        )
    if residual is not None:
        if x.dim() != 2 or residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual must match x ([num_tokens, hidden] {dtype_name(x.dtype)}), "
                f"got {list(residual.shape)} {dtype_name(residual.dtype)}"
            )
        if residual.shape[-1] and residual.stride(-1) != 1:
            raise ValueError(
                f"residual must have unit stride on its last dimension, got {residual.stride()}"
            )
    return x3


__all__ = ["rms_norm", "rms_norm_ref"]
