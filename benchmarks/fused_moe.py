"""Fused MoE kernel vs its torch reference vs a dense GEMM of the same FLOPs, side by side (GPU).

Shapes (bf16): the routed experts of Qwen3-30B-A3B (128 experts, top-8, hidden 2048, expert
width 768) and Qwen1.5-MoE-A2.7B (60 experts, top-4, hidden 2048, width 1408), at T = 1, 16,
256 and 4096 tokens, routed by softmax top-k over random logits (balanced on average, as a
trained router is over a batch).

- ``fused_us``: ``kernels.fused_moe.fused_experts`` (alignment kernel + two grouped GEMMs +
  the sum over k), eager launches; ``fused_graph_us``: the same replayed from a CUDA graph
  (how both runners run decode steps);
- ``reference_us``: ``fused_experts_ref`` (a loop over the chosen experts: what a plain torch
  implementation does, transformers' eager experts);
- ``dense_us``: two dense bf16 GEMMs ``[T*k, H] @ [H, 2I]`` and ``[T*k, I] @ [I, H]`` (cuBLAS):
  the same FLOPs with one weight matrix, so no gather and full weight reuse; the ratio
  ``fused_over_dense`` is what routing costs;
- ``align_us`` (the Triton alignment kernel) next to ``align_torch_us`` (the same result from
  the sync-free torch steps it replaces: sort, scatter, cumsums, search);
- ``tflops`` of the fused call, and ``weights_GBps``: bytes of the experts the batch touches,
  read once, over the fused time (decode is bound by it; the H200's HBM gives ~4.8 TB/s).

Run on a GPU: ``python -P benchmarks/fused_moe.py``; ``--quick`` runs tiny float32
shapes on the CPU through the Triton interpreter (a smoke test of the script, not a timing).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed

from turnout.kernels.fused_moe import (  # noqa: E402
    default_block_config,
    fused_experts,
    fused_experts_ref,
    max_num_tokens_padded,
    moe_align_block_size,
)

SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "qwen1.5-moe-a2.7b": (60, 4, 2048, 1408)}
TOKENS = (1, 16, 256, 4096)
QUICK_SHAPES = {"tiny": (8, 2, 64, 32)}
QUICK_TOKENS = (1, 16)


def _timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:  # microseconds
    for _ in range(3):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters * 1e6
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / iters * 1e3


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def torch_align(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The alignment as sync-free torch steps (the alternative to the Triton kernel)."""
    flat = topk_ids.flatten().long()
    n = flat.numel()
    max_padded = max_num_tokens_padded(n, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    rank = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=flat.device)
    sorted_ids[(ends - padded)[flat[order]] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, max_padded, block_m, device=flat.device)
    expert_ids = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def _case(
    shape: tuple[int, int, int, int],
    num_tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    iters: int,
) -> dict[str, float]:
    e, k, h, i = shape
    gen = torch.Generator().manual_seed(0)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) / h**0.5).to(dtype).to(device)
    w2 = (torch.randn(e, h, i, generator=gen) / i**0.5).to(dtype).to(device)
    x = torch.randn(num_tokens, h, generator=gen).to(dtype).to(device)
    weights, ids = torch.randn(num_tokens, e, generator=gen).softmax(-1).topk(k, dim=-1)
    weights, ids = weights.contiguous().to(device), ids.to(torch.int32).to(device)
    cfg = default_block_config(num_tokens * k, e, dtype, device)
    a, b = x.new_empty(num_tokens * k, h), w13[0].T.contiguous()
    c, d = x.new_empty(num_tokens * k, i), w2[0].T.contiguous()

    def fused() -> object:
        return fused_experts(x, w13, w2, weights, ids)

    def dense() -> object:
        return (a @ b, c @ d)

    out = {
        "fused_us": _timed(fused, device, iters),
        "reference_us": _timed(
            lambda: fused_experts_ref(x, w13, w2, weights, ids), device, max(1, iters // 10)
        ),
        "dense_us": _timed(dense, device, iters),
        "align_us": _timed(lambda: moe_align_block_size(ids, cfg.block_m, e), device, iters),
        "align_torch_us": _timed(lambda: torch_align(ids, cfg.block_m, e), device, iters),
    }
    if device.type == "cuda":
        out["fused_graph_us"] = _timed(_graphed(fused), device, iters)
    flops = 2 * num_tokens * k * (2 * i * h + h * i)
    touched = int(torch.unique(ids).numel())
    weight_bytes = touched * 3 * i * h * w13.element_size()
    result = {key: round(v, 1) for key, v in out.items()}
    result |= {
        "block_m": cfg.block_m,
        "fused_over_reference": round(out["fused_us"] / out["reference_us"], 4),
        "fused_over_dense": round(out["fused_us"] / out["dense_us"], 3),
        "tflops": round(flops / out["fused_us"] / 1e6, 2),
        "experts_touched": touched,
        "weights_GBps": round(weight_bytes / out["fused_us"] / 1e3, 1),
        "max_abs_err_vs_reference": float(
            (fused().float() - fused_experts_ref(x, w13, w2, weights, ids).float())  # type: ignore[union-attr]
            .abs()
            .max()
        ),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny float32 shapes on the CPU (smoke test)"
    )
    args = parser.parse_args()
    if args.quick:
        device, dtype, shapes, tokens, iters = (
            torch.device("cpu"),
            torch.float32,
            QUICK_SHAPES,
            QUICK_TOKENS,
            2,
        )
    else:
        assert torch.cuda.is_available(), "needs a CUDA device (or --quick)"
        device, dtype, shapes, tokens, iters = (
            torch.device("cuda"),
            torch.bfloat16,
            SHAPES,
            TOKENS,
            50,
        )
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
        "dtype": str(dtype).removeprefix("torch."),
    }
    for name, shape in shapes.items():
        e, k, h, i = shape
        result[name] = {
            "experts": e,
            "top_k": k,
            "hidden": h,
            "intermediate": i,
            **{f"T={t}": _case(shape, t, dtype, device, iters) for t in tokens},
        }
        print(name, json.dumps(result[name]), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
