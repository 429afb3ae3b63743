"""Mamba-1 selective-scan kernels vs their torch references, side by side in one run (GPU).

Shapes: Mamba-130m's mixer (intermediate size 1536, d_state 16), bf16 activations, float32
state (``kernels/selective_scan.py``). Cases:
- prefill: 8 requests of 2048 tokens from a zero state, one ``selective_scan`` launch, with
  D, the z gate and dt_bias (as ``MambaMixer`` calls it); the kernel at its default tiles and
  at each tile of a small sweep (``sweep_us``: the numbers to choose the default by);
- decode: 256 requests, one token each, continuing from their states
  (``selective_state_update``).
Baseline: the torch references on the same inputs (``*_ref``: what CPU runs use; the prefill
one steps token by token from Python, so it is timed over fewer iterations).

Memory floor: each launch must at least read its inputs and write its outputs once (x, dt, z,
B, C in and y out in bf16; the state read when continuing and written, float32; A, D, dt_bias);
``floor_us`` is those bytes at the H200's 3.35 TB/s HBM bandwidth, ``achieved_GBps`` the same
bytes over the measured time and ``fraction_of_peak`` their ratio. Decode is bound by the state
(``state_bytes``: 256 x 1536 x 16 x 4 B, read and written).

Run: python -P benchmarks/selective_scan.py  -> last line: one JSON object.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed

from turnout.kernels.selective_scan import (  # noqa: E402
    ScanBlockConfig,
    selective_scan,
    selective_scan_ref,
    selective_state_update,
    selective_state_update_ref,
)

DIM, D_STATE = 1536, 16
PEAK_BYTES_PER_S = 3.35e12  # H200 HBM3e
#: (block_d, chunk, num_warps) tried for prefill besides the default.
SWEEP = [(16, 8, 2), (32, 8, 4), (32, 16, 4), (64, 8, 4)]


def _timed(fn, iters: int, warmup: int = 3) -> float:  # type: ignore[no-untyped-def]
    """Mean time of ``fn`` in microseconds, by CUDA events around ``iters`` calls."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def _inputs(num_tokens: int, num_reqs: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Activations as the mixer makes them (bf16), HF Mamba's S4D-real A and a dt_bias that
    puts softplus(dt + dt_bias) near 0.01 (its initialisation range is 0.001 .. 0.1)."""
    dev, bf16 = "cuda", torch.bfloat16

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dev)

    return {
        "x": randn(num_tokens, DIM).to(bf16),
        "dt": randn(num_tokens, DIM, scale=0.1).to(bf16),
        "A": -torch.arange(1, D_STATE + 1, dtype=torch.float32, device=dev).repeat(DIM, 1),
        "B": randn(num_tokens, D_STATE).to(bf16),
        "C": randn(num_tokens, D_STATE).to(bf16),
        "D": torch.ones(DIM, device=dev),
        "z": randn(num_tokens, DIM).to(bf16),
        "dt_bias": torch.full((DIM,), math.log(math.expm1(0.01)), device=dev),
        "ssm_state": randn(num_reqs, DIM, D_STATE, scale=0.1),
    }


def _bandwidth(bytes_moved: int, us: float) -> dict[str, float]:
    return {
        "floor_us": round(bytes_moved / PEAK_BYTES_PER_S * 1e6, 1),
        "achieved_GBps": round(bytes_moved / us / 1e3, 1),
        "fraction_of_peak": round(bytes_moved / (us * 1e-6) / PEAK_BYTES_PER_S, 3),
    }


def _bytes(num_tokens: int, num_reqs: int, state_read: bool) -> tuple[int, int]:
    """(all bytes a launch moves at least once, the state's share)."""
    activations = num_tokens * (4 * DIM + 2 * D_STATE) * 2  # x, dt, z, y and B, C in bf16
    state = num_reqs * DIM * D_STATE * 4 * (2 if state_read else 1)
    params = DIM * D_STATE * 4 + 2 * DIM * 4  # A, D, dt_bias
    return activations + state + params, state


def prefill(num_reqs: int = 8, seq_len: int = 2048) -> dict[str, object]:
    t = num_reqs * seq_len
    a = _inputs(t, num_reqs, torch.Generator().manual_seed(0))
    batch = {
        "query_start_loc": torch.arange(0, t + 1, seq_len, dtype=torch.int32, device="cuda"),
        "state_indices": torch.arange(num_reqs, dtype=torch.int32, device="cuda"),
        "has_initial_state": torch.zeros(num_reqs, dtype=torch.bool, device="cuda"),
    }
    out = selective_scan(**a, **batch)
    want = selective_scan_ref(**{**a, "ssm_state": a["ssm_state"].clone()}, **batch)
    kernel_us = _timed(lambda: selective_scan(**a, **batch), iters=20)
    ref_us = _timed(lambda: selective_scan_ref(**a, **batch), iters=1, warmup=1)
    sweep = {}
    for block_d, chunk, warps in SWEEP:
        cfg = ScanBlockConfig(block_d, chunk, warps)
        us = _timed(lambda cfg=cfg: selective_scan(**a, **batch, block_config=cfg), iters=20)
        sweep[f"block_d={block_d},chunk={chunk},warps={warps}"] = round(us, 1)
    total, state = _bytes(t, num_reqs, state_read=False)
    return {
        "kernel_us": round(kernel_us, 1),
        "ref_us": round(ref_us, 1),
        "ref_over_kernel": round(ref_us / kernel_us, 1),
        "sweep_us": sweep,
        "max_abs_diff_vs_ref": round((out.float() - want.float()).abs().max().item(), 4),
        "bytes_moved": total,
        "state_bytes": state,
        **_bandwidth(total, kernel_us),
    }


def decode(num_reqs: int = 256) -> dict[str, object]:
    a = _inputs(num_reqs, num_reqs, torch.Generator().manual_seed(1))
    slots = torch.randperm(num_reqs, generator=torch.Generator().manual_seed(2)).int().cuda()
    out = selective_state_update(**{**a, "ssm_state": a["ssm_state"].clone()}, state_indices=slots)
    want = selective_state_update_ref(
        **{**a, "ssm_state": a["ssm_state"].clone()}, state_indices=slots
    )
    kernel_us = _timed(lambda: selective_state_update(**a, state_indices=slots), iters=200)
    ref_us = _timed(lambda: selective_state_update_ref(**a, state_indices=slots), iters=50)
    total, state = _bytes(num_reqs, num_reqs, state_read=True)
    return {
        "kernel_us": round(kernel_us, 1),
        "ref_us": round(ref_us, 1),
        "ref_over_kernel": round(ref_us / kernel_us, 1),
        "max_abs_diff_vs_ref": round((out.float() - want.float()).abs().max().item(), 4),
        "bytes_moved": total,
        "state_bytes": state,
        **_bandwidth(total, kernel_us),
    }


def main() -> int:
    if not torch.cuda.is_available():
        print(
            "benchmarks/selective_scan.py times Triton kernels on a CUDA GPU; "
            "torch.cuda.is_available() is False here",
            file=sys.stderr,
        )
        return 2
    result = {
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": _triton_version()},
        "shape": f"Mamba-130m mixer: dim {DIM}, d_state {D_STATE}, bf16 activations, float32 state",
        "peak_TBps": PEAK_BYTES_PER_S / 1e12,
        "prefill_8x2048": prefill(),
        "decode_256": decode(),
    }
    print(json.dumps(result))
    return 0


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


if __name__ == "__main__":
    sys.exit(main())
