"""runner_v2's fused layer kernels against the torch ops they replace, side by side in one run
(GPU), and a profiled steady decode step with and without them.

Kernel cases, at the Qwen3-0.6B shape in bf16 (hidden 1024, 16 query and 8 kv heads of 128,
intermediate 3072, vocabulary 151,936), for a decode step of 256 requests and a prefill chunk of
8,192 tokens:
- ``add_rms_norm``: ``residual += x; RMSNorm(residual)`` (``kernels/rms_norm.py``) vs torch's add
  and HF's RMSNorm;
- ``qk_norm``: Qwen3's per-head RMSNorm of q and k read in place from the QKV output;
- ``silu_and_mul`` (``kernels/silu_mul.py``) vs ``F.silu(gate) * up``;
- ``gumbel_sample`` at 256 x 151,936 float32 logits (temperature 1): split over the vocabulary
  vs one program per request (``num_splits=1``).
Each case reports microseconds (CUDA events, mean of 200 calls after warm-up), the bytes it
must move and the achieved bandwidth.

Decode-step profile: runner_v2 on the Qwen3-0.6B shape (random weights), 256 requests of 512
prompt tokens, driven to steady decode; 20 steps under ``torch.profiler``, fused (default) and
unfused (``set_fused_layer_ops(False)``, unsplit sampler). Reported: median wall time per step,
CUDA kernel launches per step and the kernels taking most device time. Mixed-step profile: 128
running decodes beside 8,064 prompt tokens per step (8,192 in all), 6 steps, with the two
attention launches of the step overlapped (default) and serial (``serial_attention()``).

Run: python -P benchmarks/layer_ops.py [--no-profile]  -> last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))

from benchmarks.throughput import QWEN3_06B, serial_attention, unfused_ops  # noqa: E402
from turnout.kernels.gumbel_sample import gumbel_sample  # noqa: E402
from turnout.kernels.rms_norm import rms_norm  # noqa: E402
from turnout.kernels.silu_mul import silu_and_mul  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 1024, 16, 8, 128, 3072, 151_936


def timed_us(fn: Any, iters: int = 200, warmup: int = 10) -> float:
    """Mean microseconds per call of ``fn`` (CUDA events around ``iters`` calls)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def torch_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _case(name: str, fused_us: float, torch_us: float, num_bytes: int) -> dict[str, Any]:
    return {
        "case": name,
        "fused_us": round(fused_us, 2),
        "torch_us": round(torch_us, 2),
        "speedup": round(torch_us / fused_us, 2),
        "bytes": num_bytes,
        "fused_GBps": round(num_bytes / fused_us / 1e3, 1),
    }


def kernel_cases() -> list[dict[str, Any]]:
    return [*cases_at(256), *cases_at(8192), sampler_case()]


def cases_at(tokens: int) -> list[dict[str, Any]]:
    """The layer-op cases for a step of ``tokens`` tokens (256: decode; 8,192: a prefill chunk)."""
    bf16, dev = torch.bfloat16, "cuda"
    x = torch.randn(tokens, HIDDEN, dtype=bf16, device=dev)
    res = torch.randn_like(x)
    w = torch.randn(HIDDEN, dtype=bf16, device=dev)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=bf16, device=dev)
    q = qkv[:, : HEADS * HEAD_DIM].view(tokens, HEADS, HEAD_DIM)
    hw = torch.randn(HEAD_DIM, dtype=bf16, device=dev)
    gate_up = torch.randn(tokens, 2 * INTERMEDIATE, dtype=bf16, device=dev)
    gate, up = gate_up.chunk(2, dim=-1)
    return [
        _case(
            f"add_rms_norm[{tokens}]",
            timed_us(lambda: rms_norm(x, w, 1e-6, residual=res)),
            timed_us(lambda: torch_rms_norm(res + x, w)),
            4 * x.numel() * 2,
        ),
        _case(
            f"qk_norm[{tokens}]",
            timed_us(lambda: rms_norm(q, hw, 1e-6)),
            timed_us(lambda: torch_rms_norm(q, hw)),
            2 * q.numel() * 2,
        ),
        _case(
            f"silu_and_mul[{tokens}]",
            timed_us(lambda: silu_and_mul(gate_up)),
            timed_us(lambda: torch.nn.functional.silu(gate) * up),
            3 * gate.numel() * 2,
        ),
    ]


def sampler_case(num_reqs: int = 256) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests" / "kernels"))
    from kernel_cases import sampling_tables

    tables = sampling_tables(num_reqs, seed=0)
    for name in ("temperature", "top_p", "repetition_penalty"):
        getattr(tables, name).fill_(1.0)
    for name in ("top_k", "min_p", "frequency_penalty", "presence_penalty", "min_tokens"):
        getattr(tables, name).zero_()
    tables = type(tables)(**{k: v.cuda() for k, v in vars(tables).items()})
    logits = torch.randn(num_reqs, VOCAB, device="cuda")
    idx = torch.arange(num_reqs, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((num_reqs,), 600, dtype=torch.int32, device="cuda")
    a, b = (torch.zeros(num_reqs, dtype=torch.int32, device="cuda") for _ in range(2))
    split = timed_us(lambda: gumbel_sample(logits, idx, seq_lens, tables, None, a))
    unsplit = timed_us(lambda: gumbel_sample(logits, idx, seq_lens, tables, None, b, num_splits=1))
    assert torch.equal(a, b), "split and unsplit samples differ"
    return {
        "case": f"gumbel_sample[{num_reqs}x{VOCAB}]",
        "fused_us": round(split, 2),
        "torch_us": round(unsplit, 2),
        "speedup": round(unsplit / split, 2),
        "bytes": logits.numel() * 4,
        "fused_GBps": round(logits.numel() * 4 / split / 1e3, 1),
        "note": "torch_us is the unsplit kernel (one program per request)",
    }


def qwen3_engine(model_dir: Path, num_reqs: int) -> Any:
    """runner_v2 on the Qwen3-0.6B shape in bf16 (``max_num_seqs`` = ``num_reqs``, 8,192-token budget)."""
    from turnout.engine.model_info import engine_config_for
    from turnout.engine.runner_loader import build_engine_core

    return build_engine_core(
        engine_config_for(
            model_dir,
            dtype="bfloat16",
            device="cuda",
            max_num_seqs=num_reqs,
            max_num_batched_tokens=8192,
            max_model_len=1024,
            enable_prefix_caching=False,
            seed=0,
        ),
        "v2",
    )


def add_random_requests(core: Any, first: int, count: int, gen: torch.Generator) -> None:
    """``count`` requests of 512 random prompt tokens, 400 output tokens at temperature 1."""
    from turnout.engine.sampling_params import SamplingParams

    for i in range(first, first + count):
        core.add_request(
            f"r{i}",
            torch.randint(0, VOCAB, (512,), generator=gen).tolist(),
            SamplingParams(max_tokens=400, ignore_eos=True, temperature=1.0),
        )


def _profile_steps(core: Any, num_steps: int) -> dict[str, Any]:
    # `num_steps` engine steps under torch.profiler: wall time, kernels and device time per step.
    torch.cuda.synchronize()
    walls: list[float] = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            t0 = time.perf_counter()
            core.step()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            by_name[evt.name][0] += evt.device_time_total
            by_name[evt.name][1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:14]
    return {
        "step_ms_median": round(statistics.median(walls) * 1e3, 3),
        "step_ms": [round(w * 1e3, 2) for w in walls],
        "kernels_per_step": round(sum(c for _, c in by_name.values()) / num_steps, 1),
        "device_ms_per_step": round(sum(t for t, _ in by_name.values()) / num_steps / 1e3, 3),
        "top_kernels": [
            {
                "name": n[:80],
                "us_per_step": round(t / num_steps, 1),
                "calls_per_step": c / num_steps,
            }
            for n, (t, c) in top
        ],
    }


def decode_profile(
    model_dir: Path, fused: bool, num_reqs: int = 256, num_steps: int = 20
) -> dict[str, Any]:
    """Steady decode at ``num_reqs`` running requests (512-token prompts, ~550 tokens of context)."""
    core = qwen3_engine(model_dir, num_reqs)
    add_random_requests(core, 0, num_reqs, torch.Generator().manual_seed(0))
    for _ in range(40):  # prefill (16 chunks of 8,192 tokens) and a few decode steps
        core.step()
    result = {"fused": fused, **_profile_steps(core, num_steps)}
    del core
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return result


def mixed_profile(model_dir: Path, num_steps: int = 6) -> dict[str, Any]:
    """Mixed steps of 8,192 tokens: 128 running decodes beside 8,064 tokens of 512-token prompt
    chunks (the shape of the benchmark's steps when a wave of new requests arrives)."""
    core = qwen3_engine(model_dir, 256)
    gen = torch.Generator().manual_seed(0)
    add_random_requests(core, 0, 128, gen)
    for _ in range(12):  # 8 prefill steps of 8,192 tokens, then decodes
        core.step()
    add_random_requests(core, 128, 128, gen)
    result = _profile_steps(core, num_steps)
    del core
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return result


def main() -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-profile", action="store_true", help="kernel cases only")
    p.add_argument(
        "--no-host-profile",
        action="store_true",
        help="accepted for older command lines; the host's profile is benchmarks/host_gap.py",
    )
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/layer_ops.py needs a CUDA device")
    summary: dict[str, Any] = {
        "benchmark": "layer_ops",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cases": kernel_cases(),
    }
    for case in summary["cases"]:
        print(case, flush=True)
    if not args.no_profile:
        from turnout.engine.model import write_random_weights

        with tempfile.TemporaryDirectory() as tmp:
            hf = json.loads(QWEN3_06B.read_text())["config"]
            model_dir = write_random_weights(hf, Path(tmp) / "model", dtype=torch.bfloat16, seed=0)
            summary["decode_step_fused"] = decode_profile(model_dir, fused=True)
            print(summary["decode_step_fused"], flush=True)
            with unfused_ops():
                summary["decode_step_unfused"] = decode_profile(model_dir, fused=False)
            print(summary["decode_step_unfused"], flush=True)
            summary["mixed_step"] = mixed_profile(model_dir)
            print(summary["mixed_step"], flush=True)
            with serial_attention():  # the before of the overlapped attention launches
                summary["mixed_step_serial_attention"] = mixed_profile(model_dir)
            print(summary["mixed_step_serial_attention"], flush=True)
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
