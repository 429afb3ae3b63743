"""Compile the paged-attention (unified and split-KV) and KV-write kernels for sm_90 (H100/H200) without a GPU, in
every variant the model layer launches (fp32/bf16, GQA groups, head_dim 64/128, decode and
prefill tiles, sliding window, padding rows zeroed by the kernel). Reuses compile_for_gpu.py's
launch capture; run without TRITON_INTERPRET (test_paged_attention_compiles.py does). Prints
one line per variant."""

from __future__ import annotations

import os
import sys

import torch

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(__file__))

import triton
from compile_for_gpu import CAPTURED, _capture, _signature
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction


def _launch_all() -> None:
    from test_paged_attention import make_batch

    from turnout.kernels.paged_attention import paged_attention, reshape_and_cache
    from turnout.kernels.paged_attention_split import paged_attention_split

    # (dtype, layout, [(q_lens, sliding_window)]): the real bf16 layouts in decode and prefill
    # tiles (a prefill step launches both), float32 (IEEE dots) and a sliding window on both.
    decode, prefill = ([1, 1], None), ([300, 1], None)
    variants = [
        (torch.bfloat16, (16, 8, 128), [decode, prefill, ([7, 1], 6), ([300, 1], 6)]),
        (torch.bfloat16, (32, 8, 128), [decode, prefill]),
        (torch.bfloat16, (9, 3, 64), [decode, prefill]),
        (torch.float32, (4, 2, 16), [decode, prefill]),
    ]
    for dtype, (heads, kv_heads, head_dim), cases in variants:
        for q_lens, window in cases:
            b = make_batch(
                q_lens,
                [5, 40],
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
                block_size=16,
                dtype=dtype,
                device="cpu",
            )
            # zero_padding=True, as engine/model/attention.py launches it (torch.empty output)
            paged_attention(**b, sliding_window=window, zero_padding=True)  # type: ignore[arg-type]
            if max(q_lens) == 1:  # split-KV decoding: 32 segments (a graph-captured count)
                paged_attention_split(**b, sliding_window=window, num_segments=32)  # type: ignore[arg-type]
        cache = torch.zeros(2, 4, 16, kv_heads, head_dim, dtype=dtype)
        kv = torch.zeros(3, kv_heads, head_dim, dtype=dtype)
        reshape_and_cache(kv, kv, cache, torch.tensor([0, -1, 5]))


def main() -> int:
    JITFunction.run = _capture
    _launch_all()
    target = GPUTarget("cuda", 90, 32)
    seen = set()
    for fn, args, kwargs in CAPTURED:
        signature, constexprs, options = _signature(fn, args, kwargs)
        key = (fn.__name__, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())))
        if key in seen:
            continue
        seen.add(key)
        compiled = triton.compile(
            ASTSource(fn, signature, constexprs), target=target, options=options
        )
        print(f"compiled {fn.__name__} {constexprs}: {len(compiled.asm['cubin'])} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
