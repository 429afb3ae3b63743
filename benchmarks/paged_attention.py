"""Paged attention kernels vs dense fused attention, side by side in one run (GPU).

Shapes: Qwen3-0.6B attention (16 query heads, 8 kv heads, head_dim 128), bf16, block_size 16,
blocks scattered over the cache. Cases:
- decode 256 x 1 token, 640-token contexts (docs/architecture.md §6 workload: 512-token
  prompts, 128 outputs);
- decode 1 / 4 / 16 x 1 token at 8,192 and 32,768-token contexts: split-KV
  (``kernels.paged_attention_split``) beside the unified kernel;
- prefill 8 x 512, 16 x 512, 2 x 4096 tokens from an empty cache.
Baseline: torch's ``scaled_dot_product_attention`` on the same keys and values laid out densely
([B, H_kv, S, D], ``enable_gqa=True``; prefill causal on the flash backend), which a paged
kernel cannot beat by much: the ratio says what paging costs. Decode cases report the achieved
KV bandwidth (KV bytes read / time). Every time is GPU time from CUDA-graph replays (eager
Python launches would add tens of microseconds to the short cases).

``--sweep`` also times a grid of tile options per case (``AttentionTiles``: block_m, block_n,
num_warps, num_stages; the split kernel's num_segments) and reports the best per case beside
the defaults; ``--cases a,b`` runs a subset (a sweep of all cases takes a few minutes, mostly
compiling).

Run: python benchmarks/paged_attention.py [--sweep] [--cases NAME,...]  -> last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed

from turnout.kernels.paged_attention import AttentionTiles, paged_attention  # noqa: E402
from turnout.kernels.paged_attention_split import (  # noqa: E402
    num_segments_for,
    paged_attention_split,
    split_workspace_numel,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16
DEVICE, DTYPE = "cuda", torch.bfloat16
CASES: dict[str, tuple[int, int, int]] = {  # name: (num_reqs, q_len, keys per request)
    "decode_256x1_ctx640": (256, 1, 640),
    **{f"decode_{n}x1_ctx{ctx}": (n, 1, ctx) for ctx in (8192, 32768) for n in (1, 4, 16)},
    "prefill_8x512": (8, 512, 512),
    "prefill_16x512": (16, 512, 512),
    "prefill_2x4096": (2, 4096, 4096),
}
# Sweep grids (edit freely): decode tiles for the unified kernel's decode launches, prefill
# tiles, split-KV tiles x segment counts.
DECODE_SWEEP = [AttentionTiles(16, n, w, s) for n in (32, 64, 128) for w in (2, 4) for s in (2, 3)]
PREFILL_SWEEP = [
    AttentionTiles(m, n, w, s)
    for m, n, w, s in (
        (128, 64, 8, 3),
        (128, 64, 4, 3),
        (128, 32, 4, 3),
        (64, 64, 4, 3),
        (128, 128, 8, 2),
        (64, 32, 4, 2),
        (128, 64, 8, 2),
        (64, 64, 4, 2),
    )
]
SPLIT_SWEEP = [
    (AttentionTiles(16, n, w, s), seg)
    for n in (64, 128)
    for w, s in ((4, 2), (4, 3))
    for seg in (16, 32)
]


def _timed(fn: Callable[[], None], calls: int = 20, replays: int = 10) -> float:
    """Microseconds per call: a CUDA graph of ``calls`` calls replayed ``replays`` times."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * replays) * 1e3


def _inputs(num_reqs: int, q_len: int, seq_len: int) -> dict[str, Any]:
    blocks_per_req = -(-seq_len // BLOCK)
    num_blocks = num_reqs * blocks_per_req
    dev, dt = DEVICE, DTYPE
    kv_cache = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
    table = torch.randperm(num_blocks, device=dev).view(num_reqs, blocks_per_req).int()
    query = torch.randn(num_reqs * q_len, HEADS, HEAD_DIM, device=dev, dtype=dt)
    return dict(
        query=query,
        kv_cache=kv_cache,
        query_start_loc=torch.arange(0, num_reqs + 1, device=dev, dtype=torch.int32) * q_len,
        seq_lens=torch.full((num_reqs,), seq_len, device=dev, dtype=torch.int32),
        block_table=table,
        max_query_len=q_len,
        scale=1 / math.sqrt(HEAD_DIM),
        out=torch.empty_like(query),
    )


def _dense(
    b: dict[str, Any], num_reqs: int, q_len: int, seq_len: int
) -> tuple[Callable[[], None], str]:
    """SDPA on the same K/V gathered once into [B, H_kv, S, D]; the backend it ran on."""
    kv, table = b["kv_cache"], b["block_table"].long()
    k = kv[0][table].flatten(1, 2)[:, :seq_len].transpose(1, 2).contiguous()
    v = kv[1][table].flatten(1, 2)[:, :seq_len].transpose(1, 2).contiguous()
    q = b["query"].view(num_reqs, q_len, HEADS, HEAD_DIM).transpose(1, 2)
    causal = q_len > 1  # prefill from an empty cache: queries and keys are the same positions
    sdpa = torch.nn.functional.scaled_dot_product_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if causal:
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                sdpa(q, k, v, is_causal=True, scale=b["scale"], enable_gqa=True)

            def flash() -> None:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    sdpa(q, k, v, is_causal=True, scale=b["scale"], enable_gqa=True)

            return flash, "flash"
        except RuntimeError:
            pass

    def default() -> None:
        sdpa(q, k, v, is_causal=causal, scale=b["scale"], enable_gqa=True)

    return default, "default"


def _unified(b: dict[str, Any], **opts: Any) -> Callable[[], None]:
    def run() -> None:
        paged_attention(**b, **opts)

    return run


def _split(
    b: dict[str, Any], segments: int, tiles: AttentionTiles | None = None
) -> Callable[[], None]:
    q = b["query"]
    ws = torch.empty(split_workspace_numel(q.shape[0], HEADS, HEAD_DIM, segments), device=q.device)

    def run() -> None:
        paged_attention_split(**b, num_segments=segments, tiles=tiles, workspace=ws)

    return run


def _try_time(fn: Callable[[], None]) -> float | None:
    try:
        return round(_timed(fn), 2)
    except Exception as exc:  # a tile that does not fit (shared memory, registers)
        print(f"  skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return None


def _case(name: str, sweep: bool) -> dict[str, Any]:
    num_reqs, q_len, seq_len = CASES[name]
    b = _inputs(num_reqs, q_len, seq_len)
    dense, backend = _dense(b, num_reqs, q_len, seq_len)
    t_dense = _timed(dense)
    t_unified = _timed(_unified(b))
    row: dict[str, Any] = {
        "dense_sdpa_us": round(t_dense, 1),
        "dense_backend": backend,
        "unified_us": round(t_unified, 1),
        "unified_over_dense": round(t_unified / t_dense, 3),
    }
    kv_bytes = 2 * num_reqs * seq_len * KV_HEADS * HEAD_DIM * 2
    if q_len == 1:
        row["unified_kv_read_GBps"] = round(kv_bytes / t_unified / 1e3, 1)
        if num_reqs < 256:
            segments = num_segments_for(num_reqs, KV_HEADS, b["query"].device)
            t_split = _timed(_split(b, segments))
            row.update(
                split_us=round(t_split, 1),
                split_segments=segments,
                split_over_dense=round(t_split / t_dense, 3),
                split_kv_read_GBps=round(kv_bytes / t_split / 1e3, 1),
            )
    else:
        row["dense_speed_fraction"] = round(t_dense / t_unified, 3)  # target >= 0.8
    if sweep:
        row["sweep"] = _sweep(b, q_len, num_reqs)
    print(name, json.dumps(row))
    return row


def _sweep(b: dict[str, Any], q_len: int, num_reqs: int) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    if q_len == 1:
        for tiles in DECODE_SWEEP:
            us = _try_time(_unified(b, decode_tiles=tiles))
            if us is not None:
                results.append({"kernel": "unified", **tiles.__dict__, "us": us})
        if num_reqs < 256:
            for tiles, segments in SPLIT_SWEEP:
                us = _try_time(_split(b, segments, tiles))
                if us is not None:
                    results.append(
                        {"kernel": "split", **tiles.__dict__, "num_segments": segments, "us": us}
                    )
    else:
        for tiles in PREFILL_SWEEP:
            us = _try_time(_unified(b, prefill_tiles=tiles))
            if us is not None:
                results.append({"kernel": "unified", **tiles.__dict__, "us": us})
    results.sort(key=lambda r: r["us"])
    best_by_kernel = {
        k: next(r for r in results if r["kernel"] == k) for k in {r["kernel"] for r in results}
    }
    return {
        "best": results[0] if results else None,
        "best_by_kernel": best_by_kernel,
        "top5": results[:5],
        "configs_timed": len(results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time a grid of tile options")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "sweep": args.sweep,
        "shape": f"heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}, bf16, block_size {BLOCK}",
    }
    for name in args.cases.split(","):
        result[name] = _case(name, args.sweep)
        torch.cuda.empty_cache()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
