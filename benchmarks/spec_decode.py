"""Speculative decoding on runner_v2: output tokens/s and TPOT with and without speculation.

The Qwen3-0.6B shape (``policies/reference/model_configs/qwen3-0.6b.json``) with random bf16
weights; prompts of ``--prompt-len`` random tokens, ``--output-len`` output tokens each
(``ignore_eos``), greedy by default. Each configuration runs at concurrency 1 (one request at a
time) and 32 (32 requests in flight, the engine's ``max_num_seqs``):

- ``plain``: no speculation;
- ``draft_model_self_k3``: the target as its own draft, 3 drafts per step (every draft is
  accepted: the cost of proposing and verifying at the best acceptance; a draft as large as the
  target cannot be faster than plain decoding: it shows the overhead of the machinery);
- ``ngram_gpu_k3``: n-gram drafts from the token table (random prompts: few matches).

Per configuration and concurrency: output tokens/s over the timed pass, TPOT (per request,
``(finish - first token) / (output tokens - 1)``, p50 and mean), TTFT p50, engine steps, the
acceptance rate and mean acceptance length (``EngineCore.spec_decode_stats``) and the CUDA-graph
step count. Each engine is warmed up first (Triton compilation; graphs are captured at build).

    python benchmarks/spec_decode.py            # the GPU run (a few minutes on an H200)
    python benchmarks/spec_decode.py --quick    # a smoke run on CPU (tiny model, interpreter)

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))
if "--quick" in sys.argv or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # runner_v2's kernels on the CPU

from turnout.engine.core import EngineCore  # noqa: E402
from turnout.engine.model import write_random_weights  # noqa: E402
from turnout.engine.model_info import engine_config_for  # noqa: E402
from turnout.engine.runner_loader import build_engine_core  # noqa: E402
from turnout.engine.sampling_params import SamplingParams  # noqa: E402

QWEN3_06B = ROOT / "policies" / "reference" / "model_configs" / "qwen3-0.6b.json"
QUICK_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CONCURRENCY = (1, 32)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="tiny model on CPU, a few requests (smoke run)"
    )
    p.add_argument("--configs", default="plain,draft_model_self_k3,ngram_gpu_k3")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests per concurrency slot")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.prompt_len, args.output_len, args.requests_per_slot, args.dtype = 16, 8, 1, "float32"
    return args


def spec_of(name: str, model_dir: Path) -> dict[str, Any] | None:
    if name == "plain":
        return None
    method, _, k = name.rpartition("_k")
    spec: dict[str, Any] = {"num_speculative_tokens": int(k)}
    if method == "draft_model_self":
        spec.update(method="draft_model", model=str(model_dir))
    else:
        spec["method"] = method
    return spec


def timed_pass(
    core: EngineCore, prompts: list[list[int]], concurrency: int, params: SamplingParams
) -> dict[str, Any]:
    """All prompts through the engine, at most ``concurrency`` in flight; per-request times."""
    pending = list(enumerate(prompts))
    first: dict[str, float] = {}
    ends: dict[str, tuple[float, int]] = {}
    in_flight: set[str] = set()
    steps = core.num_steps
    start = time.perf_counter()
    while pending or core.has_unfinished_requests():
        while pending and len(in_flight) < concurrency:
            i, prompt = pending.pop(0)
            core.add_request(f"r{i}", prompt, params)
            in_flight.add(f"r{i}")
        done = core.step()
        now = time.perf_counter()
        for req_id, req in core.scheduler.requests.items():
            if req.output_token_ids and req_id not in first:
                first[req_id] = now
        for req in done:
            first.setdefault(req.req_id, now)
            ends[req.req_id] = (now, len(req.output_token_ids))
            in_flight.discard(req.req_id)
    elapsed = time.perf_counter() - start
    num_out = sum(n for _, n in ends.values())
    tpot = [(end - first[r]) / (n - 1) for r, (end, n) in ends.items() if n > 1]
    return {
        "seconds": round(elapsed, 3),
        "output_tokens": num_out,
        "output_tokens_per_s": round(num_out / elapsed, 1),
        "tpot_ms_p50": round(1e3 * statistics.median(tpot), 3) if tpot else None,
        "tpot_ms_mean": round(1e3 * statistics.fmean(tpot), 3) if tpot else None,
        "steps": core.num_steps - steps,
    }


def run_config(
    name: str, model_dir: Path, prompts: list[list[int]], args: argparse.Namespace, device: str
) -> dict[str, Any]:
    core = build_engine_core(
        engine_config_for(
            model_dir,
            dtype=args.dtype,
            device=device,
            max_num_seqs=max(CONCURRENCY),
            max_model_len=args.prompt_len + args.output_len + 8,
            enable_prefix_caching=False,
            seed=args.seed,
            speculative_config=spec_of(name, model_dir),
        ),
        "v2",
    )
    params = SamplingParams(
        max_tokens=args.output_len, ignore_eos=True, temperature=args.temperature
    )
    for i, prompt in enumerate(
        prompts[: max(CONCURRENCY)]
    ):  # warm-up: compile every kernel variant
        core.add_request(
            f"warm{i}",
            prompt,
            SamplingParams(max_tokens=8, ignore_eos=True, temperature=args.temperature),
        )
    core.run_until_done()
    out: dict[str, Any] = {}
    for c in CONCURRENCY:
        before = (
            core.runner.num_graph_steps,
            core.spec_decode_stats.num_draft_tokens,
            core.spec_decode_stats.num_accepted_tokens,
            core.spec_decode_stats.num_drafts,
        )
        _sync(device)
        result = timed_pass(core, prompts[: c * args.requests_per_slot], c, params)
        stats = core.spec_decode_stats
        drafted, accepted, drafts = (
            stats.num_draft_tokens - before[1],
            stats.num_accepted_tokens - before[2],
            stats.num_drafts - before[3],
        )
        result["cuda_graph_steps"] = core.runner.num_graph_steps - before[0]
        if drafted:
            result["acceptance_rate"] = round(accepted / drafted, 4)
            result["mean_acceptance_length"] = round(1 + accepted / drafts, 3)
        out[f"concurrency_{c}"] = result
        print(f"  {name} c={c}: {result}", flush=True)
    del core
    _free(device)
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = "cpu" if args.quick or not torch.cuda.is_available() else "cuda"
    hf_config = QUICK_CONFIG if args.quick else json.loads(QWEN3_06B.read_text())["config"]
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(
        3,
        hf_config["vocab_size"],
        (max(CONCURRENCY) * args.requests_per_slot, args.prompt_len),
        generator=gen,
    ).tolist()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_weights(
            hf_config, Path(tmp) / "model", dtype=getattr(torch, args.dtype), seed=args.seed
        )
        for name in args.configs.split(","):
            print(f"running {name} ...", flush=True)
            try:
                results[name] = run_config(name, model_dir, prompts, args, device)
            except Exception as exc:  # one configuration failing still reports the others
                traceback.print_exc()
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            _free(device)
    speedup = {}
    plain = results.get("plain", {})
    for name, res in results.items():
        if name != "plain" and "error" not in res and "error" not in plain:
            speedup[name] = {
                c: round(res[c]["output_tokens_per_s"] / plain[c]["output_tokens_per_s"], 3)
                for c in res
            }
    summary = {
        "benchmark": "spec_decode",
        "quick": args.quick,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "model": "tiny qwen3" if args.quick else "Qwen3-0.6B shape, random weights",
        "dtype": args.dtype,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "temperature": args.temperature,
        "concurrency": list(CONCURRENCY),
        "results": results,
        "speedup_vs_plain": speedup,
        "torch": torch.__version__,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
