"""Tensor parallelism on GPUs: output tokens/s at TP=1 and TP=2, and whether TP=2's greedy
bf16 tokens equal TP=1's.

Workload: the Llama-3.1-8B shape (``policies/reference/model_configs/llama-3.1-8b.json``) with
random bf16 weights drawn on each GPU (``load_format="dummy"``: the same seed gives every rank,
and TP=1, the same full tensors; each rank keeps its shard), ``--num-prompts`` prompts of
``--prompt-len`` random tokens, ``--output-len`` output tokens each (``ignore_eos``, seeded
sampling at temperature 1), ``max_num_seqs`` ``--max-num-seqs``. Each engine gets a short
warm-up first (Triton compilation; CUDA graphs are captured when it is built, not timed).

Greedy check: ``--num-check-prompts`` prompts, ``--check-len`` greedy tokens each, at TP=1 and
TP=2 on the same weights; per runner the number of prompts whose tokens are equal, and where
the others first differ (bf16 partial sums of the row-parallel layers round differently from
one GEMM's, so a near-tie may flip; float32 equality is the CPU suite's,
tests/parity/test_parity_tensor_parallel.py).

NCCL runs with NVLink multicast off (``NCCL_NVLS_ENABLE=0``, set before any group is made).
Needs no pydantic (the runners are pinned by name, not chosen by the oracle).

    python benchmarks/tensor_parallel.py               # >= 2 GPUs (minutes on 2x H200)
    python benchmarks/tensor_parallel.py --quick       # a smoke run on CPU: tiny shape, gloo

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before torch.distributed makes any group

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))
if "--quick" in sys.argv or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # runner_v2's kernels on the CPU

from turnout.engine.model_info import engine_config_for  # noqa: E402
from turnout.engine.runner_loader import build_engine_core  # noqa: E402
from turnout.engine.sampling_params import SamplingParams  # noqa: E402

LLAMA_8B = ROOT / "policies" / "reference" / "model_configs" / "llama-3.1-8b.json"
#: --quick: the 8B config's structure at a tiny size (heads divisible by 2, GQA kept).
QUICK_SHAPE = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 257,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shape on CPU (gloo), a few prompts")
    p.add_argument("--runners", default="v1,v2", help="comma list of v1, v2")
    p.add_argument("--tp", type=int, default=2, help="the tensor-parallel size compared with 1")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-check-prompts", type=int, default=4)
    p.add_argument("--check-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.dtype, args.device = "bfloat16", "cuda"
    if args.quick:
        args.num_prompts, args.prompt_len, args.output_len, args.max_num_seqs = 6, 16, 4, 4
        args.max_num_batched_tokens, args.num_check_prompts, args.check_len = 64, 2, 6
        args.dtype, args.device = "float32", "cpu"
    return args


def model_config(quick: bool) -> dict[str, Any]:
    """The HF config of the benchmarked shape (``QUICK_SHAPE`` over the 8B's with ``quick``)."""
    config: dict[str, Any] = json.loads(LLAMA_8B.read_text())["config"]
    return {**config, **QUICK_SHAPE} if quick else config


def random_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num, length), generator=gen).tolist()


def greedy_agreement(one: list[list[int]], split: list[list[int]]) -> dict[str, Any]:
    """How many prompts' greedy tokens are equal, and the first differing position of the others
    (``None``: equal)."""
    first = [
        next(
            (i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b),
            None if len(x) == len(y) else min(len(x), len(y)),
        )
        for x, y in zip(one, split, strict=True)
    ]
    return {"equal": sum(f is None for f in first), "of": len(first), "first_difference": first}


def run(
    runner: str,
    model_dir: Path,
    tp: int,
    args: argparse.Namespace,
    prompts: list[list[int]],
    checks: list[list[int]],
) -> tuple[dict[str, Any], list[list[int]]]:
    """One engine: the greedy tokens of ``checks``, then one timed pass over ``prompts``."""
    core = build_engine_core(
        engine_config_for(
            model_dir,
            dtype=args.dtype,
            device=args.device,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.prompt_len + args.output_len,
            enable_prefix_caching=False,
            seed=args.seed,
            load_format="dummy",
            tensor_parallel_size=tp,
        ),
        runner,
    )
    try:
        greedy = SamplingParams(max_tokens=args.check_len, temperature=0, ignore_eos=True)
        for i, prompt in enumerate(checks):
            core.add_request(f"check{i}", prompt, greedy)
        done = {r.req_id: r.output_token_ids for r in core.run_until_done()}
        tokens = [list(done[f"check{i}"]) for i in range(len(checks))]
        warm = SamplingParams(max_tokens=4, ignore_eos=True)
        for i, prompt in enumerate(prompts[: args.max_num_seqs]):
            core.add_request(f"warm{i}", prompt, warm)
        core.run_until_done()
        params = SamplingParams(
            max_tokens=args.output_len, ignore_eos=True, temperature=1.0, seed=args.seed
        )
        _sync(args.device)
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            core.add_request(f"r{i}", prompt, params)
        num_out = sum(len(r.output_token_ids) for r in core.run_until_done())
        _sync(args.device)
        elapsed = time.perf_counter() - start
    finally:
        core.shutdown()
        del core
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return {
        "seconds": round(elapsed, 3),
        "output_tokens": num_out,
        "output_tokens_per_s": round(num_out / elapsed, 1),
    }, tokens


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not args.quick and torch.cuda.device_count() < args.tp:
        raise SystemExit(
            f"needs {args.tp} GPUs (this machine has {torch.cuda.device_count()}); --quick runs on CPU"
        )
    config = model_config(args.quick)
    prompts = random_prompts(args.num_prompts, args.prompt_len, config["vocab_size"], args.seed)
    checks = random_prompts(
        args.num_check_prompts, args.prompt_len, config["vocab_size"], args.seed + 1
    )
    result: dict[str, Any] = {
        "benchmark": "tensor_parallel",
        "shape": "llama-3.1-8b" + (" (quick: shrunk)" if args.quick else ""),
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
        "tp": args.tp,
        "workload": {
            k: getattr(args, k) for k in ("num_prompts", "prompt_len", "output_len", "max_num_seqs")
        },
        "runners": {},
    }
    with tempfile.TemporaryDirectory(prefix="tp-bench-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))  # dummy weights: the config only
        for runner in args.runners.split(","):
            one, one_tokens = run(runner, Path(tmp), 1, args, prompts, checks)
            split, split_tokens = run(runner, Path(tmp), args.tp, args, prompts, checks)
            agreement = greedy_agreement(one_tokens, split_tokens)
            result["runners"][runner] = {
                "tp1": one,
                f"tp{args.tp}": split,
                "speedup": round(split["output_tokens_per_s"] / one["output_tokens_per_s"], 3),
                "greedy_tokens_equal": agreement["equal"] == agreement["of"],
                "greedy": agreement,
            }
            print(f"{runner}: {json.dumps(result['runners'][runner])}", flush=True)
    print(json.dumps(result), flush=True)
    return result


def _sync(device: str) -> None:
    # rank 0's device only: the other ranks' work of a step ends in collectives with it
    if device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
