"""Compile the Mamba-1 kernels (causal conv1d and its decode update, selective scan and its
decode update) for sm_90 (H100/H200) without a GPU, in the variants the model launches: bf16
and float32, Mamba-130m's layout (dim 1536, d_state 16, width 4) with and without bias, D,
z and dt_bias, softplus on and off, and the benchmark's tile sweep. Reuses compile_for_gpu.py's
launch capture; run without TRITON_INTERPRET (test_mamba_kernels_compile.py does). Prints one
line per variant with its registers and spills ("stack")."""

from __future__ import annotations

import os
import sys

import torch

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(__file__))

import triton
from compile_for_gpu import CAPTURED, _capture, _signature
from compile_mla_attention import _resource_usage
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

DIM, D_STATE, WIDTH = 1536, 16, 4
#: The tiles benchmarks/selective_scan.py sweeps (block_d, chunk, num_warps).
SWEEP = [(16, 8, 2), (32, 8, 4), (32, 16, 4), (64, 8, 4)]


def _launch_all() -> None:
    from turnout.kernels.causal_conv1d import causal_conv1d, causal_conv1d_update
    from turnout.kernels.selective_scan import (
        ScanBlockConfig,
        selective_scan,
        selective_state_update,
    )

    qsl = torch.tensor([0, 5, 6], dtype=torch.int32)
    slots = torch.tensor([1, 0], dtype=torch.int32)
    init = torch.tensor([False, True])
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.zeros(6, DIM, dtype=dtype)
        weight, bias = torch.zeros(DIM, WIDTH, dtype=dtype), torch.zeros(DIM, dtype=dtype)
        conv_state = torch.zeros(2, DIM, WIDTH - 1, dtype=dtype)
        for b in (bias, None):
            causal_conv1d(x, weight, b, conv_state, qsl, slots, init, activation="silu")
            causal_conv1d_update(x[:2], weight, b, conv_state, slots, activation="silu")
        causal_conv1d(x, weight, bias, conv_state, qsl, slots, init, activation=None)
        A, D, dt_bias = (torch.zeros(DIM, D_STATE), torch.zeros(DIM), torch.zeros(DIM))
        bc = torch.zeros(6, 2 * D_STATE, dtype=dtype)  # B and C: views of x_proj's output
        ssm_state = torch.zeros(2, DIM, D_STATE)
        for with_all in (True, False):
            opt = (D, x, dt_bias) if with_all else (None, None, None)
            selective_scan(
                x,
                x,
                A,
                bc[:, :D_STATE],
                bc[:, D_STATE:],
                *opt,
                ssm_state,
                qsl,
                slots,
                init,
                delta_softplus=with_all,
            )
            opt = (D, x[:2], dt_bias) if with_all else (None, None, None)
            selective_state_update(
                x[:2],
                x[:2],
                A,
                bc[:2, :D_STATE],
                bc[:2, D_STATE:],
                *opt,
                ssm_state,
                slots,
                delta_softplus=with_all,
            )
        if dtype == torch.bfloat16:
            for block_d, chunk, warps in SWEEP:
                selective_scan(
                    x,
                    x,
                    A,
                    bc[:, :D_STATE],
                    bc[:, D_STATE:],
                    D,
                    x,
                    dt_bias,
                    ssm_state,
                    qsl,
                    slots,
                    init,
                    block_config=ScanBlockConfig(block_d, chunk, warps),
                )


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
            f"compiled {fn.__name__} {constexprs} {options}: shared {compiled.metadata.shared}"
            f"{_resource_usage(compiled.asm['cubin'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
