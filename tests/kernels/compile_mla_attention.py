"""Compile the MLA latent-attention and latent-cache-write kernels for sm_90 (H100/H200) without
a GPU, in every variant the model layer launches (bf16 at DeepSeek-V2-Lite's and DeepSeek-V2's
layouts in decode, split decode and prefill tiles, fp32). Reuses compile_for_gpu.py's launch capture; run
without TRITON_INTERPRET (test_mla_attention_compiles.py does). Prints one line per variant
with its registers, spills and shared memory."""

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
    from test_mla_attention import make_batch

    from turnout.kernels.mla_attention import mla_attention
    from turnout.kernels.mla_cache import concat_and_cache_mla

    decode, prefill = [1, 1], [300, 1]
    variants = [
        (torch.bfloat16, (16, 512, 64)),
        (torch.bfloat16, (128, 512, 64)),
        (torch.float32, (16, 512, 64)),
        (torch.float32, (4, 32, 8)),
    ]
    for dtype, (heads, rank, rope) in variants:
        for q_lens, splits in ((decode, 1), (decode, 64), (prefill, 1)):
            b = make_batch(
                q_lens,
                [5, 40],
                num_heads=heads,
                rank=rank,
                rope=rope,
                block_size=16,
                dtype=dtype,
                device="cpu",
            )
            mla_attention(**b, num_kv_splits=splits)  # type: ignore[arg-type]
        cache = torch.zeros(4, 16, rank + rope, dtype=dtype)
        concat_and_cache_mla(
            torch.zeros(3, rank, dtype=dtype),
            torch.zeros(3, rope, dtype=dtype),
            cache,
            torch.tensor([0, -1, 5]),
        )


def _resource_usage(cubin: bytes) -> str:
    # Registers and spill stores as cuobjdump reads them from the cubin, to tune the tiles
    # without a GPU.
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.cubin")
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True)
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", out.stdout)
    return f", regs {found.group(1)}, stack {found.group(2)}" if found else ""


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
        print(
            f"compiled {fn.__name__} {constexprs} {options}: shared {compiled.metadata.shared}"
            f"{_resource_usage(compiled.asm['cubin'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
