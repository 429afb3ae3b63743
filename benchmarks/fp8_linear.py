"""FP8 W8A8 linear (``engine.model.fp8.fp8_linear``: per-token activation quantisation +
``torch._scaled_mm``) vs the bf16 ``F.linear`` of the same layer, side by side in one run (GPU),
and vs the dequantising reference (``fp8_linear_ref``) that CPUs and GPUs without FP8 use.

Shapes: Qwen3-8B's projections (hidden 4096: qkv 4096 -> 6144, o 4096 -> 4096, gate_up
4096 -> 24576, down 12288 -> 4096) at M tokens of 1, 16, 256 (decode batches) and 4096
(a prefill chunk). Times are the mean of 50 replays of a CUDA graph of one call, after warm-ups
(CUDA events), in microseconds: GPU time, as the runners' graph-replayed decode steps see it;
``speedup`` is bf16 time / FP8 time, summed over the four projections.

Run: python benchmarks/fp8_linear.py  -> last line: one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed

from turnout.engine.model.fp8 import fp8_linear, fp8_linear_ref  # noqa: E402
from turnout.engine.model.fp8_checkpoint import quantize_fp8_weight  # noqa: E402
from turnout.engine.model.fp8_config import Fp8Scheme  # noqa: E402

PROJECTIONS = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 24576),
    "down": (12288, 4096),
}
TOKENS = (1, 16, 256, 4096)


def _timed(fn, iters: int = 50) -> float:  # type: ignore[no-untyped-def]
    # Replays of a CUDA graph of `fn` (as both runners run decode steps): GPU time, without
    # Python's launch overhead (tens of microseconds for a Triton launch, more than a GEMV).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # microseconds


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    results: dict[str, dict[str, float]] = {}
    for m in TOKENS:
        totals = {"bf16_us": 0.0, "fp8_us": 0.0, "reference_us": 0.0}
        for k, n in PROJECTIONS.values():
            w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
            q, scale = quantize_fp8_weight(w, Fp8Scheme("channel", "dynamic"))
            scale = scale.reshape(-1)
            w16 = w.bfloat16()
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            totals["bf16_us"] += _timed(lambda x=x, w16=w16: F.linear(x, w16))
            totals["fp8_us"] += _timed(lambda x=x, q=q, scale=scale: fp8_linear(x, q, scale))
            totals["reference_us"] += _timed(
                lambda x=x, q=q, scale=scale: fp8_linear_ref(x, q, scale)
            )
        totals["speedup"] = totals["bf16_us"] / totals["fp8_us"]
        results[f"M={m}"] = {k: round(v, 2) for k, v in totals.items()}
        print(f"M={m}: {results[f'M={m}']}")
    print(
        json.dumps(
            {
                "benchmark": "fp8_linear",
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "shapes": "Qwen3-8B projections",
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
