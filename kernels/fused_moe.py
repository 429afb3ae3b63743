"""Fused mixture-of-experts: the routed experts of a sparse MoE layer in three launches.

Each token ``t`` is routed to ``k`` experts (``topk_ids[t]``) with weights
``topk_weights[t]``; its output is ``sum_j w[t, j] * down_e(silu(gate_e(x)) * up_e(x))`` with
``e = topk_ids[t, j]`` and the expert weights stacked ``w13[e] = [gate_e; up_e]`` (``[2I, H]``)
and ``w2[e] = down_e`` (``[H, I]``), the layout of vLLM's ``FusedMoE`` and of transformers 5's
``*Experts`` modules (``gate_up_proj``, ``down_proj``).

1. ``moe_align_block_size`` (``kernels/moe_align.py``, one Triton program): the ``T * k``
   (token, expert) assignments, numbered ``t * k + j``, are grouped by expert into
   ``sorted_token_ids``, each expert's run padded to a multiple of ``BLOCK_M`` with the
   sentinel ``T * k``; ``expert_ids[b]`` is the expert of block ``b`` and
   ``num_tokens_post_padded`` the padded total (vLLM's ``moe_align_block_size``). It is a
   kernel rather than a torch prep step because the prep is about ten small torch launches
   (sort, scatter, two cumsums, a search, index writes) whose latencies add up to more than
   the decode GEMMs it serves: at one token and top-8 of 128 experts (Qwen3-30B-A3B) the
   ~75 MB of expert weights read per layer take ~16 us on an H200 (``benchmarks/fused_moe.py``
   times both, ``align_us`` and ``align_torch_us``). Everything stays on the device: buffer
   sizes are bounded from host shapes (``T * k + min(E, T * k) * (BLOCK_M - 1)`` slots), so
   the layer runs inside a CUDA graph and never synchronises.
2. ``_fused_moe_kernel`` (grouped GEMM over the sorted blocks; one program per ``BLOCK_M``
   slots x ``BLOCK_N`` output columns, one expert per block), launched twice: gate and up
   accumulate side by side and ``silu(gate) * up`` is the epilogue (the intermediate
   ``[T * k, I]`` is written once, no ``[T * k, 2I]`` pass), then the down projection with
   the routing weight multiplied in its epilogue, written per assignment ``[T * k, H]``.
3. The sum over ``k`` of each token's rows, in float32 (a fixed order: no atomics, the output
   is deterministic).

Programs past ``num_tokens_post_padded`` return at once (the grid is sized by the bound), so
an expert no token chose costs nothing. Float32 inputs use IEEE dot products (exact parity
tests), bf16/fp16 the tensor cores with float32 accumulation. Which slot an assignment gets
inside its expert's run depends on the order of the atomics on a GPU; no result does (each
row of a GEMM tile is computed on its own).

``fused_experts_ref`` is the torch reference (per expert, float32 arithmetic, rounded to the
input dtype where the kernel stores: the intermediate and the weighted per-assignment rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnout.kernels._checks import dtype_name
from turnout.kernels._triton import require_triton, tl, triton
from turnout.kernels.moe_align import (
    max_num_tokens_padded,
    moe_align_block_size,
    moe_align_block_size_ref,
)

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class MoEBlockConfig:
    """Tile sizes of one ``fused_experts`` call (``block_m`` also pads the expert runs)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1  # consecutive m-blocks that walk the n-blocks together (L2 reuse of weights)
    num_warps: int = 4
    num_stages: int = 3


def default_block_config(
    num_assignments: int, num_experts: int, dtype: torch.dtype, device: torch.device
) -> MoEBlockConfig:
    """Tiles for ``num_assignments = T * k`` spread over ``num_experts``.

    Few assignments per expert (decode): 16-row blocks, so that padding wastes little and the
    weights stream through many programs (the weight read is the cost); many (prefill): 64-row
    blocks with grouped ordering. Shared memory bounds the pipeline depth (float32 tiles are
    twice as large). The CPU interpreter gets small tiles: its cost is per operation.
    """
    if device.type != "cuda":
        return MoEBlockConfig(block_m=16, block_n=32, block_k=32)
    per_expert = num_assignments / max(num_experts, 1)
    if per_expert <= 16:
        cfg = MoEBlockConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4)
    elif per_expert <= 64:
        cfg = MoEBlockConfig(block_m=32, block_n=64, block_k=64, group_m=8, num_warps=4)
    else:
        cfg = MoEBlockConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=8)
    size = torch.empty((), dtype=dtype).element_size()
    # gated GEMM: one A tile and two B tiles (gate, up) per stage
    per_stage = size * cfg.block_k * (cfg.block_m + 2 * cfg.block_n)
    stages = max(1, min(4, (160 * 1024) // per_stage))
    return MoEBlockConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.num_warps, stages)


@triton.jit  # type: ignore[untyped-decorator]
def _fused_moe_kernel(  # type: ignore[no-untyped-def]
    a_ptr,  # [rows, K]: hidden states (A_ROW_DIV = top_k) or the intermediate (A_ROW_DIV = 1)
    b_ptr,  # [E, N or 2N, K]: stacked expert weights, unit stride over K
    c_ptr,  # [num_assignments, N], written at row = assignment
    topk_weights_ptr,  # [num_assignments] float32
    sorted_token_ids_ptr,  # [max_num_tokens_padded] int32
    expert_ids_ptr,  # [num_m_blocks] int32
    num_tokens_post_padded_ptr,  # [1] int32
    N,
    K,
    num_assignments,  # also the sentinel of padding slots
    num_m_blocks,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    A_ROW_DIV: tl.constexpr,
    GATED: tl.constexpr,  # B holds [gate; up] (2N rows): write silu(gate) * up
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" keeps float32 exact; "tf32" is the default otherwise
):
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_M m-blocks (mostly of one expert) sweep the n-blocks together,
    # so an expert's weight tile is read from L2 rather than HBM by its neighbours.
    in_group = GROUP_M * num_n_blocks
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_tokens_post_padded_ptr):
        return  # the grid is sized by the bound; this block holds no assignment
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(sorted_token_ids_ptr + slots)
    row_mask = ids < num_assignments
    a_rows = (ids // A_ROW_DIV).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    kk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + kk[None, :]
    b_ptrs = b_ptr + expert * stride_be + cols.to(tl.int64)[None, :] * stride_bn + kk[:, None]
    up_ptrs = b_ptrs + N * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = kk < K - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if GATED:
            up = tl.load(up_ptrs, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
            acc_up = tl.dot(a, up, acc_up, input_precision=DOT_PRECISION)
            up_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up  # silu(gate) * up, in float32
    if MUL_ROUTED_WEIGHT:
        weight = tl.load(topk_weights_ptr + ids, mask=row_mask, other=0.0)
        acc = acc * weight[:, None]
    c_ptrs = c_ptr + ids.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def fused_experts(
    hidden: torch.Tensor,  # [T, H] float32/float16/bfloat16
    w13: torch.Tensor,  # [E, 2 * I, H], hidden's dtype: [gate; up] of each expert
    w2: torch.Tensor,  # [E, H, I], hidden's dtype: down of each expert
    topk_weights: torch.Tensor,  # [T, k] float32
    topk_ids: torch.Tensor,  # [T, k] int32, in [0, E)
    *,
    block_config: MoEBlockConfig | None = None,  # default: default_block_config(...)
) -> torch.Tensor:  # [T, H], hidden's dtype
    """The routed experts' weighted sum for every token (Triton; see the module docstring).

    No host synchronisation: safe inside a CUDA graph. Expert ids out of range are not
    checked (:func:`fused_experts_ref` checks them).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    require_triton()
    num_tokens, top_k, num_experts, inter = _check_experts(hidden, w13, w2, topk_weights, topk_ids)
    hidden_size = hidden.shape[1]
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    num_assignments = num_tokens * top_k
    cfg = block_config or default_block_config(
        num_assignments, num_experts, hidden.dtype, hidden.device
    )
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, cfg.block_m, num_experts)
    dev, dtype = hidden.device, hidden.dtype
    intermediate = torch.empty(num_assignments, inter, dtype=dtype, device=dev)
    per_assignment = torch.empty(num_assignments, hidden_size, dtype=dtype, device=dev)
    flat_weights = topk_weights.view(-1)
    for a, b, c, n, k, row_div, gated in (
        (hidden, w13, intermediate, inter, hidden_size, top_k, True),
        (intermediate, w2, per_assignment, hidden_size, inter, 1, False),
    ):
        num_m_blocks = expert_ids.shape[0]
        grid = (num_m_blocks * triton.cdiv(n, cfg.block_n),)
        _fused_moe_kernel[grid](
            a,
            b,
            c,
            flat_weights,
            sorted_ids,
            expert_ids,
            num_post,
            n,
            k,
            num_assignments,
            num_m_blocks,
            a.stride(0),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            A_ROW_DIV=row_div,
            GATED=gated,
            MUL_ROUTED_WEIGHT=not gated,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return (
        per_assignment.view(num_tokens, top_k, hidden_size)
        .sum(dim=1, dtype=torch.float32)
        .to(dtype)
    )


def fused_experts_ref(
    hidden: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] float32
    topk_ids: torch.Tensor,  # [T, k] int32
) -> torch.Tensor:  # [T, H], hidden's dtype
    """Torch reference of :func:`fused_experts` (what CPU runs use): one expert at a time,
    float32 arithmetic, rounded to the input dtype where the kernel stores. Reads the chosen
    experts to the host.

    Raises:
        ValueError: shapes, dtypes or strides do not match, or an expert id is out of range.
    """
    num_tokens, top_k, num_experts, inter = _check_experts(hidden, w13, w2, topk_weights, topk_ids)
    dtype = hidden.dtype
    flat_ids = topk_ids.reshape(-1).long()
    if flat_ids.numel() and (int(flat_ids.min()) < 0 or int(flat_ids.max()) >= num_experts):
        raise ValueError(
            f"topk_ids must lie in [0, {num_experts}), got "
            f"[{int(flat_ids.min())}, {int(flat_ids.max())}]"
        )
    flat_weights = topk_weights.reshape(-1)
    rows_out = torch.zeros(
        flat_ids.numel(), hidden.shape[1], dtype=torch.float32, device=hidden.device
    )
    for e in torch.unique(flat_ids).tolist():
        rows = (flat_ids == e).nonzero()[:, 0]
        x = hidden[rows // top_k].float()
        gate, up = torch.split(x @ w13[e].float().T, inter, dim=-1)
        act = (torch.nn.functional.silu(gate) * up).to(dtype).float()
        y = (act @ w2[e].float().T) * flat_weights[rows, None]
        rows_out[rows] = y.to(dtype).float()
    return rows_out.view(num_tokens, top_k, hidden.shape[1]).sum(dim=1).to(dtype)


def _check_experts(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> tuple[int, int, int, int]:
    if hidden.dim() != 2 or hidden.dtype not in _FLOAT_DTYPES or hidden.stride(1) != 1:
        raise ValueError(
            f"hidden must be [T, H] float32/float16/bfloat16 with unit inner stride, got "
            f"{tuple(hidden.shape)} {dtype_name(hidden.dtype)}, strides {hidden.stride()}"
        )
    num_tokens, hidden_size = hidden.shape
    if w13.dim() != 3 or w13.shape[2] != hidden_size or w13.shape[1] % 2:
        raise ValueError(f"w13 must be [E, 2 * I, H={hidden_size}], got {tuple(w13.shape)}")
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (num_experts, hidden_size, inter):
        raise ValueError(
            f"w2 must be [E={num_experts}, H={hidden_size}, I={inter}], got {tuple(w2.shape)}"
        )
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype != hidden.dtype or w.stride(2) != 1:
            raise ValueError(
                f"{name} must be {dtype_name(hidden.dtype)} (hidden's dtype) with unit "
                f"inner stride, got {dtype_name(w.dtype)}, strides {w.stride()}"
            )
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != num_tokens
        or topk_ids.dtype != torch.int32
        or not topk_ids.is_contiguous()
    ):
        raise ValueError(
            f"topk_ids must be a contiguous [T={num_tokens}, k] int32 tensor, got "
            f"{tuple(topk_ids.shape)} {dtype_name(topk_ids.dtype)}, strides {topk_ids.stride()}"
        )
    top_k = topk_ids.shape[1]
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, E={num_experts}], got {top_k}")
    if (
        tuple(topk_weights.shape) != (num_tokens, top_k)
        or topk_weights.dtype != torch.float32
        or not topk_weights.is_contiguous()
    ):
        raise ValueError(
            f"topk_weights must be a contiguous [T={num_tokens}, k={top_k}] float32 tensor, got "
            f"{tuple(topk_weights.shape)} {dtype_name(topk_weights.dtype)}"
        )
    devices = {t.device for t in (hidden, w13, w2, topk_weights, topk_ids)}
    if len(devices) != 1:
        raise ValueError(f"every tensor must be on one device, got {sorted(map(str, devices))}")
    return num_tokens, top_k, num_experts, inter


__all__ = [
    "MoEBlockConfig",
    "default_block_config",
    "fused_experts",
    "fused_experts_ref",
    "max_num_tokens_padded",
    "moe_align_block_size",
    "moe_align_block_size_ref",
]
