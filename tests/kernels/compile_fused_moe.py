"""Compile the fused-MoE kernels for sm_90 (H100/H200) without a GPU, in the variants the model
layer launches: bf16 at a decode shape (Qwen3-30B-A3B, one token: 16-row blocks) and a prefill
shape (Qwen1.5-MoE-A2.7B, 4096 tokens: 64-row blocks, grouped ordering), and float32 (IEEE
dots) at the decode shape. Tile sizes are the GPU's (``default_block_config`` for a CUDA
device). Reuses compile_for_gpu.py's launch capture; run without TRITON_INTERPRET
(test_fused_moe_compiles.py does). Prints one line per variant."""

from __future__ import annotations

import contextlib
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

#: (dtype, num_tokens, num_experts, top_k, hidden, intermediate)
VARIANTS = [
    (torch.bfloat16, 1, 128, 8, 2048, 768),
    (torch.bfloat16, 4096, 60, 4, 2048, 1408),
    (torch.float32, 1, 128, 8, 2048, 768),
]


def _launch_all() -> None:
    from turnout.kernels import fused_moe as fm

    for dtype, t, e, k, h, i in VARIANTS:
        cfg = fm.default_block_config(t * k, e, dtype, torch.device("cuda"))
        x, ids = torch.zeros(t, h, dtype=dtype), torch.zeros(t, k, dtype=torch.int32)
        w13, w2 = torch.zeros(e, 2 * i, h, dtype=dtype), torch.zeros(e, h, i, dtype=dtype)
        # The launches are captured, not run: the outputs stay empty and the sum over k may
        # fail afterwards; only the captured signatures matter here.
        with contextlib.suppress(Exception):
            fm.fused_experts(x, w13, w2, torch.zeros(t, k), ids, block_config=cfg)


def main() -> int:
    JITFunction.run = _capture
    _launch_all()
    target = GPUTarget("cuda", 90, 32)
    seen = set()
    for fn, args, kwargs in CAPTURED:
        signature, constexprs, options = _signature(fn, args, kwargs)
        key = (
            fn.__name__,
            tuple(sorted(signature.items())),
            tuple(sorted(constexprs.items())),
            tuple(sorted(options.items())),
        )
        if key in seen:
            continue
        seen.add(key)
        compiled = triton.compile(
            ASTSource(fn, signature, constexprs), target=target, options=options
        )
        print(
            f"compiled {fn.__name__} {constexprs} {options}: {len(compiled.asm['cubin'])} bytes, "
            f"{compiled.metadata.shared} bytes of shared memory"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
