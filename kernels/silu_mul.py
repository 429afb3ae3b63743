"""``silu(gate) * up`` of a gated MLP in one kernel (Shazeer 2020, "GLU Variants Improve
Transformer"; vLLM's ``SiluAndMul``, vllm/model_executor/layers/activation.py).

The fused ``gate_up_proj`` output ``[num_tokens, 2 * intermediate]`` holds ``gate`` in its first
half and ``up`` in its second; torch needs a SiLU kernel and a multiply (two reads and two writes
of the intermediate activations), this kernel reads each half once and writes the product once.

Numerics are HF's ``act_fn(gate_proj(x)) * up_proj(x)`` in the model dtype: SiLU is computed in
float32 and rounded to the dtype, then multiplied by ``up`` and rounded again, as torch does for
``F.silu`` followed by ``*`` on bf16 tensors; only ``exp``'s last-place rounding may differ.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import dtype_name
from turnout.kernels._triton import require_triton, tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _silu_and_mul_kernel(  # type: ignore[no-untyped-def]
    gate_up_ptr,
    gate_up_stride,
    out_ptr,
    intermediate_size,
    BLOCK_SIZE: tl.constexpr,
):
    # Grid (num_tokens, column blocks): each program one block of one token's columns.
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < intermediate_size
    row = gate_up_ptr + tok * gate_up_stride
    gate = tl.load(row + cols, mask=mask, other=0.0)
    up = tl.load(row + intermediate_size + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + tok * intermediate_size + cols, out, mask=mask)


def silu_and_mul(
    gate_up: torch.Tensor,  # [num_tokens, 2 * intermediate] float, unit last stride
) -> torch.Tensor:  # [num_tokens, intermediate] gate_up's dtype, contiguous
    """``silu(gate_up[:, :I]) * gate_up[:, I:]`` in one Triton kernel.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: gate_up is not 2-D with an even last dimension and unit last stride.
    """
    require_triton()
    _check(gate_up)
    num_tokens, width = gate_up.shape
    intermediate = width // 2
    out = torch.empty((num_tokens, intermediate), dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens == 0 or intermediate == 0:
        return out
    block = min(1024, triton.next_power_of_2(intermediate))
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(intermediate, block))](
        gate_up,
        gate_up.stride(0),
        out,
        intermediate,
        BLOCK_SIZE=block,
        num_warps=4,
    )
    return out


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Torch reference of :func:`silu_and_mul` (HF's gated MLP activation)."""
    _check(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).contiguous()


def _check(gate_up: torch.Tensor) -> None:
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(
            f"gate_up must be [num_tokens, 2 * intermediate], got shape {tuple(gate_up.shape)}"
        )
    if gate_up.shape[1] and gate_up.stride(1) != 1:
        raise ValueError(
            f"gate_up must have unit stride on its last dimension, got {gate_up.stride()}"
        )
    if not gate_up.dtype.is_floating_point:
        raise ValueError(f"gate_up must be a float tensor, got {dtype_name(gate_up.dtype)}")


__all__ = ["silu_and_mul", "silu_and_mul_ref"]
