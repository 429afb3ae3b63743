"""Paged attention kernel vs dense fused attention, side by side in one run (GPU).

Shapes: Qwen3-0.6B attention (16 query heads, 8 kv heads, head_dim 128), bf16, block_size 16,
blocks scattered over the cache. Cases (DESIGN §6 workload: 512-token prompts, 128 outputs):
- decode: 256 requests, one query each, contexts of 640 tokens;
- prefill: 8 requests of 512 new tokens.
Baseline: torch's scaled_dot_product_attention (flash / memory-efficient backends) on the same
keys and values laid out contiguously ([B, H, S, D], GQA expanded), which a paged kernel cannot
beat by much: the ratio says what paging costs. Decode also reports the achieved bandwidth
(KV bytes read / time).

Run: python benchmarks/paged_attention.py  -> last line: one JSON object.
"""

from __future__ import annotations

import json
import math

import torch

from kernels.paged_attention import paged_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16


def _timed(fn, iters: int = 50) -> float:  # type: ignore[no-untyped-def]
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # microseconds


def _case(num_reqs: int, q_len: int, ctx_len: int) -> dict[str, float]:
    seq_len = ctx_len + q_len
    blocks_per_req = -(-seq_len // BLOCK)
    num_blocks = num_reqs * blocks_per_req
    dev, dt = "cuda", torch.bfloat16
    kv_cache = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
    table = torch.randperm(num_blocks, device=dev).view(num_reqs, blocks_per_req).int()
    query = torch.randn(num_reqs * q_len, HEADS, HEAD_DIM, device=dev, dtype=dt)
    qsl = torch.arange(0, num_reqs + 1, device=dev, dtype=torch.int32) * q_len
    seq_lens = torch.full((num_reqs,), seq_len, device=dev, dtype=torch.int32)
    out = torch.empty_like(query)
    scale = 1 / math.sqrt(HEAD_DIM)

    def paged() -> None:
        paged_attention(query, kv_cache, qsl, seq_lens, table, q_len, scale, out=out)

    # Dense baseline: the same K/V gathered once into [B, H_kv, S, D].
    k = kv_cache[0][table.long()].flatten(1, 2)[:, :seq_len].transpose(1, 2).contiguous()
    v = kv_cache[1][table.long()].flatten(1, 2)[:, :seq_len].transpose(1, 2).contiguous()
    q = query.view(num_reqs, q_len, HEADS, HEAD_DIM).transpose(1, 2)
    assert q_len == 1 or ctx_len == 0, "cases are pure decode or pure prefill"

    def dense() -> None:  # decode: no mask needed; prefill from 0: causal (flash backend)
        torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=q_len > 1, scale=scale, enable_gqa=True)

    t_paged, t_dense = _timed(paged), _timed(dense)
    kv_bytes = 2 * num_reqs * seq_len * KV_HEADS * HEAD_DIM * 2
    return {"paged_us": round(t_paged, 1), "dense_sdpa_us": round(t_dense, 1),
            "paged_over_dense": round(t_paged / t_dense, 3),
            "paged_kv_read_GBps": round(kv_bytes / t_paged / 1e3, 1)}


def main() -> None:
    assert torch.cuda.is_available(), "needs a CUDA device"
    result = {
        "device": torch.cuda.get_device_name(),
        "shape": f"heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}, bf16, block_size {BLOCK}",
        "decode_256x1_ctx640": _case(256, 1, 639),
        "prefill_8x512": _case(8, 512, 0),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
