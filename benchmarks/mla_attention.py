"""MLA latent attention over the paged latent cache vs attention over expanded keys/values, side
by side in one run (GPU).

Shape: DeepSeek-V2-Lite attention (16 heads, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 128, v_head_dim 128), bf16, block_size 16, blocks scattered over the cache.

- latent: ``kernels.mla_attention.mla_attention`` reading 576 values per token (decode batches
  split each request's keys when the batch is small, ``num_kv_splits_for``);
- latent, unsplit: the same kernel with ``num_kv_splits=1`` (decode cases);
- expanded: what a cache of per-head keys and values would hold (16 x (192 + 128) = 5120 values
  per token, 8.9x the latent row), laid out contiguously ``[B, H, S, D]`` and attended by
  torch's ``scaled_dot_product_attention`` (flash / memory-efficient backends); for prefill its
  time includes the ``kv_b_proj`` GEMM that expands the latents (``expand_us``).

Decode cases report the latent bytes read per second. Run: ``python benchmarks/mla_attention.py``
-> last line: one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed

from turnout.kernels.mla_attention import mla_attention, num_kv_splits_for  # noqa: E402

HEADS, RANK, ROPE, NOPE, V_DIM, BLOCK = 16, 512, 64, 128, 128, 16
SCALE = (NOPE + ROPE) ** -0.5


def _timed(fn, iters: int = 30) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
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
    assert q_len == 1 or ctx_len == 0, "cases are pure decode or pure prefill"
    dev, dt = "cuda", torch.bfloat16
    seq_len = ctx_len + q_len
    blocks_per_req = -(-seq_len // BLOCK)
    num_blocks = num_reqs * blocks_per_req
    cache = torch.randn(num_blocks, BLOCK, RANK + ROPE, device=dev, dtype=dt)
    table = torch.randperm(num_blocks, device=dev).view(num_reqs, blocks_per_req).int()
    query = torch.randn(num_reqs * q_len, HEADS, RANK + ROPE, device=dev, dtype=dt)
    qsl = torch.arange(0, num_reqs + 1, device=dev, dtype=torch.int32) * q_len
    seq_lens = torch.full((num_reqs,), seq_len, device=dev, dtype=torch.int32)
    out = torch.empty(num_reqs * q_len, HEADS, RANK, device=dev, dtype=dt)

    def latent(splits: int | None = None) -> None:
        mla_attention(
            query, cache, qsl, seq_lens, table, q_len, SCALE, RANK, out=out, num_kv_splits=splits
        )

    w_kv_b = torch.randn(HEADS * (NOPE + V_DIM), RANK, device=dev, dtype=dt) / RANK**0.5
    rows = cache[table.long()].flatten(1, 2)[:, :seq_len]  # [B, S, rank + rope]

    def expand() -> tuple[torch.Tensor, torch.Tensor]:
        kv = (rows[..., :RANK] @ w_kv_b.T).view(num_reqs, seq_len, HEADS, NOPE + V_DIM)
        k_pe = rows[:, :, None, RANK:].expand(-1, -1, HEADS, -1)
        k = torch.cat([kv[..., :NOPE], k_pe], dim=-1).transpose(1, 2)
        return k, kv[..., NOPE:].transpose(1, 2)

    k, v = (t.contiguous() for t in expand())
    q = torch.randn(num_reqs, HEADS, q_len, NOPE + ROPE, device=dev, dtype=dt)

    def expanded() -> None:  # decode: no mask needed; prefill from 0: causal
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=q_len > 1, scale=SCALE)

    t_latent, t_expanded = _timed(latent), _timed(expanded)
    result = {
        "latent_us": round(t_latent, 1),
        "expanded_sdpa_us": round(t_expanded, 1),
        "latent_over_expanded": round(t_latent / t_expanded, 3),
    }
    if q_len == 1:
        t_unsplit = _timed(lambda: latent(1))
        result |= {
            "num_kv_splits": num_kv_splits_for(num_reqs, 1, query.device),
            "latent_unsplit_us": round(t_unsplit, 1),
            "split_speedup": round(t_unsplit / t_latent, 2),
            "latent_read_GBps": round(num_reqs * seq_len * (RANK + ROPE) * 2 / t_latent / 1e3, 1),
        }
    else:
        t_expand = _timed(expand)
        result |= {
            "expand_us": round(t_expand, 1),
            "latent_over_expand_plus_sdpa": round(t_latent / (t_expand + t_expanded), 3),
        }
    return result


def main() -> None:
    assert torch.cuda.is_available(), "needs a CUDA device"
    result = {
        "device": torch.cuda.get_device_name(),
        "shape": f"DeepSeek-V2-Lite MLA: {HEADS} heads, latent {RANK} + rope {ROPE}, bf16, block_size {BLOCK}",
        "decode_256x1_ctx640": _case(256, 1, 639),
        "decode_32x1_ctx4096": _case(32, 1, 4095),
        "decode_1x1_ctx8192": _case(1, 1, 8191),
        "prefill_8x512": _case(8, 512, 0),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
