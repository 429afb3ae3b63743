"""TTFT and TPOT (p50, p99) of runner_v1, runner_v2 and HF transformers ``generate`` at fixed
concurrency, side by side in one run (docs/architecture.md §6).

Workload: the Qwen3-0.6B shape with random bf16 weights (as ``benchmarks/throughput.py``),
prompts of 512 random tokens, 128 output tokens each (``ignore_eos``), temperature 1. For each
concurrency ``c`` in 1, 8, 32, 256 the engines run closed-loop: ``c`` requests in flight, a new
one added as soon as one finishes, ``requests_per_level(c)`` requests in all. Per request:

- TTFT: from ``add_request`` to the step after which its first output token is visible;
- TPOT: (time of its last token - time of its first) / (output tokens - 1).

Times are host wall-clock after each ``EngineCore.step()`` (runner_v2 applies step N's tokens
when step N+1 is launched, so its token times include that one-step lag, as a client would see
them). HF ``generate`` runs batches of ``c`` prompts; its TTFT is a batch's ``max_new_tokens=1``
time and its TPOT ``(full - first) / 127``, every request of a batch sharing them.

Run: python -P benchmarks/latency.py [--levels 1,8,32,256] -> last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))

from benchmarks.throughput import QWEN3_06B, make_prompts  # noqa: E402
from turnout.engine.model import write_random_weights  # noqa: E402
from turnout.engine.model_info import engine_config_for  # noqa: E402
from turnout.engine.runner_loader import build_engine_core  # noqa: E402
from turnout.engine.sampling_params import SamplingParams  # noqa: E402

PROMPT_LEN, OUTPUT_LEN = 512, 128


def requests_per_level(concurrency: int) -> int:
    """Requests run at a concurrency: enough for stable percentiles, bounded in time."""
    return {1: 8, 8: 32, 32: 96}.get(concurrency, 2 * concurrency)


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds (nearest-rank on the sorted values)."""
    xs = sorted(values)

    def rank(q: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] * 1e3

    return {"p50_ms": round(rank(0.50), 2), "p99_ms": round(rank(0.99), 2)}


def run_engine_level(
    core: Any, prompts: list[list[int]], concurrency: int, tag: str
) -> dict[str, Any]:
    """One closed-loop pass at ``concurrency``; TTFT and TPOT percentiles of its requests."""
    params = SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True, temperature=1.0)
    pending = list(range(len(prompts)))
    added: dict[str, float] = {}
    first: dict[str, float] = {}
    in_flight: dict[str, Any] = {}
    ttft, tpot = [], []

    def top_up() -> None:
        while pending and len(in_flight) < concurrency:
            i = pending.pop(0)
            req_id = f"{tag}-{i}"
            in_flight[req_id] = core.add_request(req_id, prompts[i], params)
            added[req_id] = time.perf_counter()

    top_up()
    while core.has_unfinished_requests():
        finished = core.step()
        now = time.perf_counter()
        for req_id, req in in_flight.items():
            if req_id not in first and req.output_token_ids:
                first[req_id] = now
                ttft.append(now - added[req_id])
        for req in finished:
            if in_flight.pop(req.req_id, None) is not None:
                tpot.append((now - first[req.req_id]) / max(len(req.output_token_ids) - 1, 1))
        top_up()
    return {"num_requests": len(prompts), "ttft": percentiles(ttft), "tpot": percentiles(tpot)}


def run_engine(
    runner: str, model_dir: Path, prompts: list[list[int]], levels: list[int]
) -> dict[str, Any]:
    core = build_engine_core(
        engine_config_for(
            model_dir,
            dtype="bfloat16",
            device="cuda",
            max_num_seqs=max(levels),
            max_num_batched_tokens=8192,
            max_model_len=PROMPT_LEN + OUTPUT_LEN,
            enable_prefix_caching=False,
            seed=0,
        ),
        runner,
    )
    run_engine_level(core, prompts[:4], 4, "warm")
    out = {}
    for c in levels:
        out[str(c)] = run_engine_level(core, prompts[: requests_per_level(c)], c, f"c{c}")
        print(f"  {runner} c={c}: {out[str(c)]}", flush=True)
    del core
    torch.cuda.empty_cache()
    return out


def run_hf(model_dir: Path, prompts: list[list[int]], levels: list[int]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = (
        AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
        .cuda()
        .eval()
    )

    def timed(batch: list[list[int]], max_new: int) -> float:
        ids = torch.tensor(batch, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(prompts[:4], 4)
    out = {}
    for c in levels:
        ttft, tpot = [], []
        chosen = prompts[: requests_per_level(c)]
        for i in range(0, len(chosen), c):
            batch = chosen[i : i + c]
            t1, full = timed(batch, 1), timed(batch, OUTPUT_LEN)
            ttft += [t1] * len(batch)
            tpot += [(full - t1) / (OUTPUT_LEN - 1)] * len(batch)
        out[str(c)] = {
            "num_requests": len(chosen),
            "ttft": percentiles(ttft),
            "tpot": percentiles(tpot),
        }
        print(f"  hf c={c}: {out[str(c)]}", flush=True)
    return out


def main() -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="1,8,32,256", help="comma list of concurrencies")
    p.add_argument("--runners", default="v1,v2,hf", help="comma list of v1, v2, hf")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/latency.py needs a CUDA device")
    levels = [int(x) for x in args.levels.split(",")]
    hf_config = json.loads(QWEN3_06B.read_text())["config"]
    prompts = make_prompts(
        max(requests_per_level(c) for c in levels), PROMPT_LEN, hf_config["vocab_size"], 0
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_weights(
            hf_config, Path(tmp) / "model", dtype=torch.bfloat16, seed=0
        )
        for runner in args.runners.split(","):
            print(f"running {runner} ...", flush=True)
            results[runner] = (
                run_hf(model_dir, prompts, levels)
                if runner == "hf"
                else run_engine(runner, model_dir, prompts, levels)
            )
            torch.cuda.empty_cache()
    summary = {
        "benchmark": "latency",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "prompt_len": PROMPT_LEN,
        "output_len": OUTPUT_LEN,
        "results": results,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
