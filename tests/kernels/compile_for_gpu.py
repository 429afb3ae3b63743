"""Compile every runner_v2 kernel for an H100/H200 (sm_90) without a GPU.

The interpreter that runs the kernels on CPU is more lenient than the compiler (types of
loop-carried values, scalar/tensor mixing), so this script calls each launcher with CPU tensors,
captures the launch instead of running it, and compiles the captured signature with Triton's
bundled ptxas. Run in a process without ``TRITON_INTERPRET`` (``test_compile_for_gpu.py`` does).
Prints one line per kernel; exits non-zero on the first compile error.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

sys.path.insert(0, os.path.dirname(__file__))

_TYPES = {
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.bool: "*i1",
}
CAPTURED: list[tuple[JITFunction, tuple, dict]] = []


def _capture(self, *args, grid, warmup, **kwargs):  # replaces JITFunction.run
    CAPTURED.append((self, args, kwargs))


def _signature(fn: JITFunction, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    signature, constexprs, options = {}, {}, {}
    values = dict(zip(fn.arg_names, args, strict=False))
    for key, value in kwargs.items():
        if key in fn.arg_names:
            values[key] = value
        else:
            options[key] = value
    for param in fn.params:
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {param.name}={value!r}")
    return signature, constexprs, options


def _launch_all() -> None:
    import test_gumbel_sample as ts
    import test_input_prep as tp
    import test_topk_logprobs as tl

    for seed, pad in ((0, True),):
        for name in dir(tp):
            if name.startswith("test_"):
                fn = getattr(tp, name)
                if "seed" in fn.__code__.co_varnames[: fn.__code__.co_argcount]:
                    kwargs = {"seed": seed}
                    if "pad" in fn.__code__.co_varnames[: fn.__code__.co_argcount]:
                        kwargs["pad"] = pad
                    _try(fn, **kwargs)
                elif fn.__code__.co_argcount == 0:
                    _try(fn)
    _try(ts.test_penalty_counts_match_reference, seed=0)
    _try(ts.test_sampler_matches_reference, seed=0, vocab_size=700)
    tables, idx, _, seq_lens, logits = ts._batch(0, 300)
    from turnout.kernels.gumbel_sample import gumbel_sample

    gumbel_sample(logits, idx, seq_lens, tables, None, torch.zeros(10, dtype=torch.int32))
    tables, idx, _, seq_lens, logits = ts._batch(0, 4000)  # 4 blocks of 1024: 3 slices
    gumbel_sample(
        logits, idx, seq_lens, tables, None, torch.zeros(10, dtype=torch.int32), num_splits=3
    )
    _try(tl.test_matches_full_log_softmax, seed=1, vocab_size=3000, max_k=20)
    _try(tl.test_wide_k_and_sampled_token_rank)
    _launch_layer_ops()


def _launch_layer_ops() -> None:
    from turnout.kernels.rms_norm import rms_norm
    from turnout.kernels.silu_mul import silu_and_mul

    for dtype in (torch.bfloat16, torch.float32):
        for hidden in (128, 1024):  # a Qwen3 head, a Qwen3-0.6B hidden state
            x, w = torch.ones(4, hidden, dtype=dtype), torch.ones(hidden, dtype=dtype)
            rms_norm(x, w, 1e-6)
            rms_norm(x, w, 1e-6, residual=x.clone())
        silu_and_mul(torch.ones(4, 2 * 3072, dtype=dtype))
        from turnout.kernels.rotary import qk_norm_rope

        cos = torch.ones(64, 64)
        qkv = torch.ones(4, (16 + 2 * 8) * 128, dtype=dtype)  # Qwen3-0.6B's heads
        for weights in ((None, None), (torch.ones(128, dtype=dtype), torch.ones(128, dtype=dtype))):
            qk_norm_rope(qkv, torch.zeros(4, dtype=torch.int64), cos, cos, 16, 8, *weights)


def _try(fn, **kwargs) -> None:
    # The launches are captured, so the tests' own assertions fail afterwards: only the
    # captured signatures matter here.
    with contextlib.suppress(Exception):
        fn(**kwargs)


def main() -> int:
    JITFunction.run = _capture
    # Launch with the GPU's block sizes although the tensors are on the CPU.
    import turnout.kernels._select as select

    select.MAX_INTERPRETER_BLOCK = 1024
    _launch_all()
    from turnout.kernels.gumbel_noise import gumbel_noise

    gumbel_noise(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 100)
    seen = set()
    target = GPUTarget("cuda", 90, 32)
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
            f"compiled {fn.__name__} {constexprs} {options}: {len(compiled.asm['cubin'])} bytes of cubin"
        )
    names = {k[0] for k in seen}
    print(f"{len(seen)} variants of {len(names)} kernels: {sorted(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
