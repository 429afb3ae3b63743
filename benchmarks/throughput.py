"""Output tokens/s of runner_v1, runner_v2 and HF transformers ``generate``, side by side in one run.

docs/architecture.md §6 workload: the Qwen3-0.6B shape
(``policies/reference/model_configs/qwen3-0.6b.json``) with random bf16 weights, 1024 prompts of 512
random tokens, 128 output tokens each (``ignore_eos``), ``max_num_seqs`` 256, default sampling
(temperature 1, no top-k/top-p). The same weights, prompts and engine settings for both runners; HF
``generate`` runs the prompts in batches of ``max_num_seqs`` with the same sampling (``top_k=0``).
Each contender gets a short warm-up first (Triton compilation: for the engines a pass of 1.5 x
``max_num_seqs`` prompts with 8 output tokens; runner_v2 captures its CUDA graphs and runs its own
start-up warm-up when it is built, which is not timed).

Contenders (``--runners``): ``v1``, ``v2``, ``v2-unfused`` (runner_v2 with RMSNorm, the residual
adds and SiLU·mul as torch ops and an unsplit sampler: the before of its fused kernels),
``v2-serial`` (runner_v2 with a mixed step's decode and prefill attention launches one after the
other instead of overlapped on two streams: ``set_overlapped_launches(False)``), ``hf``
(eager ``generate``) and ``hf-compiled`` (``generate`` with a static cache and transformers'
``compile_config``: the first of ``HF_COMPILE_MODES`` that runs, named in the result with the
errors of those that did not).

Also printed: the memory-bandwidth floor, the time to read what a run must read at the
device's bandwidth — the weights once per decode step (batches of ``max_num_seqs``) and every
request's KV cache once per decode step — and the tokens/s that floor allows.

Needs no pydantic (it does not go through the oracle: the runners are pinned by name).

    python benchmarks/throughput.py            # the GPU run (a few minutes on an H200; refused without CUDA)
    python benchmarks/throughput.py --quick    # a smoke run on CPU (tiny model, interpreter)

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))
if "--quick" in sys.argv or not torch.cuda.is_available():
    # On the CPU, runner_v2's kernels run through Triton's interpreter (chosen before import).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.step_timing import drive  # noqa: E402
from turnout.engine.model import write_random_weights  # noqa: E402
from turnout.engine.model.config import ModelConfig  # noqa: E402
from turnout.engine.model.kv_cache import kv_cache_bytes_per_block  # noqa: E402
from turnout.engine.model_info import engine_config_for  # noqa: E402
from turnout.engine.runner_loader import build_engine_core  # noqa: E402
from turnout.engine.sampling_params import SamplingParams  # noqa: E402

QWEN3_06B = ROOT / "policies" / "reference" / "model_configs" / "qwen3-0.6b.json"
#: Vendor datasheet HBM bandwidths (bytes/s) by device name; others: --bandwidth-tbps.
SPEC_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}
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


#: The names ``--runners`` takes (the module docstring says what each is).
CONTENDERS = ("v1", "v2", "v2-unfused", "v2-serial", "hf", "hf-compiled")


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, except an option whose default is None (its help says
    what it falls back to)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(
    argv: list[str] | None = None, *, cuda_available: bool | None = None
) -> argparse.Namespace:
    """The command line; exits 2 (as argparse does for a bad flag) for an unknown or repeated
    contender, and for the full workload without a CUDA device (``cuda_available``, default
    ``torch.cuda.is_available()``): on the CPU it runs for hours."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=_HelpWithDefaults
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny model on CPU, a few prompts (smoke run); sets the sizes below to the --quick values",
    )
    p.add_argument(
        "--runners",
        default="v1,v2,hf",
        help="comma list, each once, of v1, v2, v2-unfused (v2 without its fused layer kernels), "
        "v2-serial (v2 with a mixed step's attention launches not overlapped), hf, "
        "hf-compiled (static cache + torch.compile)",
    )
    p.add_argument("--num-prompts", type=int, default=1024, help="prompts timed (--quick: 12)")
    p.add_argument("--prompt-len", type=int, default=512, help="tokens per prompt (--quick: 24)")
    p.add_argument(
        "--output-len", type=int, default=128, help="output tokens per prompt (--quick: 6)"
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=256,
        help="requests per engine step, and HF generate's batch (--quick: 4)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=8192,
        help="tokens per engine step (--quick: 64)",
    )
    p.add_argument("--dtype", default="bfloat16", help="weights and activations (--quick: float32)")
    p.add_argument(
        "--bandwidth-tbps",
        type=float,
        default=None,
        help="device bandwidth for the floor, TB/s (default: the datasheet figure of an H200, H100 "
        "or A100, else a measured copy on the GPU; 0.02 on the CPU)",
    )
    p.add_argument("--seed", type=int, default=0, help="weights and prompts")
    args = p.parse_args(argv)
    runners = args.runners.split(",")
    unknown = [r for r in runners if r not in CONTENDERS]
    if unknown:
        p.error(
            f"argument --runners: invalid choice: {unknown[0]!r} (choose from {', '.join(CONTENDERS)})"
        )
    twice = [r for i, r in enumerate(runners) if r in runners[:i]]
    if twice:  # results are keyed by contender: a second run would replace the first's
        p.error(f"argument --runners: {twice[0]!r} named twice")
    if args.quick:
        args.num_prompts, args.prompt_len, args.output_len = 12, 24, 6
        args.max_num_seqs, args.max_num_batched_tokens, args.dtype = 4, 64, "float32"
    elif not (torch.cuda.is_available() if cuda_available is None else cuda_available):
        # It used to run the full workload on the CPU without a word: hours of the interpreter.
        p.error(
            "no CUDA device: the full workload (the Qwen3-0.6B shape over "
            f"{args.num_prompts} prompts) would run for hours on the CPU; pass --quick for "
            "the CPU smoke run, or run it on a GPU"
        )
    return args


def make_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num, length), generator=gen).tolist()


def run_engine(
    runner: str, model_dir: Path, prompts: list[list[int]], args: argparse.Namespace, device: str
) -> dict[str, Any]:
    """Build the engine, warm it up, time one pass over every prompt."""
    core = build_engine_core(
        engine_config_for(
            model_dir,
            dtype=args.dtype,
            device=device,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.prompt_len + args.output_len,
            enable_prefix_caching=False,
            seed=args.seed,
        ),
        runner,
    )
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=1.0)
    # The warm-up is a short pass of the timed shape: 1.5 x max_num_seqs prompts, so that its
    # steps include the wave changes (mixed steps of every request count) that compile kernel
    # variants; nothing of it is timed.
    warm = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0)
    for i, prompt in enumerate(prompts[: min(len(prompts), args.max_num_seqs * 3 // 2)]):
        core.add_request(f"warm{i}", prompt, warm)
    core.run_until_done()
    steps_before = core.num_steps
    runner_v2_counts = (
        getattr(core.runner, "num_graph_steps", 0),
        getattr(core.runner, "num_eager_steps", 0),
        getattr(core.runner, "num_mixed_graph_steps", 0),
    )
    _sync(device)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, params)
    done, by_kind = drive(core)
    _sync(device)
    elapsed = time.perf_counter() - start
    num_out = sum(len(r.output_token_ids) for r in done)
    result = {
        "seconds": round(elapsed, 3),
        "output_tokens": num_out,
        "output_tokens_per_s": round(num_out / elapsed, 1),
        "steps": core.num_steps - steps_before,
        "step_time_by_kind": by_kind,
    }
    if hasattr(core.runner, "num_graph_steps"):  # runner_v2: decode steps replayed as graphs
        result["cuda_graph_steps"] = core.runner.num_graph_steps - runner_v2_counts[0]
        result["eager_steps"] = core.runner.num_eager_steps - runner_v2_counts[1]
    if hasattr(core.runner, "num_mixed_graph_steps"):  # of those, prefill chunks beside decodes
        result["mixed_graph_steps"] = core.runner.num_mixed_graph_steps - runner_v2_counts[2]
    del core, done
    _free(device)
    return result


@contextlib.contextmanager
def unfused_ops() -> Iterator[None]:
    """runner_v2 as it was before its fused kernels: RMSNorm, the residual adds and SiLU·mul as
    torch ops, and one sampler program per request (no split over the vocabulary)."""
    import turnout.kernels.gumbel_sample as sampler
    from turnout.engine.model.layers import set_fused_layer_ops

    previous, target = set_fused_layer_ops(False), sampler.TARGET_PROGRAMS
    sampler.TARGET_PROGRAMS = 0
    try:
        yield
    finally:
        set_fused_layer_ops(previous)
        sampler.TARGET_PROGRAMS = target


@contextlib.contextmanager
def serial_attention() -> Iterator[None]:
    """A mixed step's two attention launches (decodes, prompt chunks) one after the other on one
    stream, as before they overlapped; the graphs captured inside keep it."""
    from turnout.kernels.paged_attention import set_overlapped_launches

    previous = set_overlapped_launches(False)
    try:
        yield
    finally:
        set_overlapped_launches(previous)


#: torch.compile modes tried for the compiled HF peer, in order: HF's default for a static
#: cache ("reduce-overhead": CUDA graphs), then compiled kernels without graphs.
HF_COMPILE_MODES = ("reduce-overhead", "default")


def run_hf_compiled(
    model_dir: Path, prompts: list[list[int]], args: argparse.Namespace, device: str
) -> dict[str, Any]:
    """HF ``generate`` with a static cache and its forward compiled (transformers' own
    ``compile_config``), the first of ``HF_COMPILE_MODES`` that runs; the others' errors are
    reported. The warm-up is a whole batch of the timed shape, so no compilation is timed."""
    from transformers import CompileConfig

    failures: dict[str, str] = {}
    for mode in HF_COMPILE_MODES:
        torch._dynamo.reset()
        try:
            result = run_hf(
                model_dir,
                prompts,
                args,
                device,
                cache_implementation="static",
                compile_config=CompileConfig(mode=mode),
                warmup_full=True,
            )
        except Exception as exc:  # the next mode; the reason is kept
            failures[mode] = f"{type(exc).__name__}: {str(exc)[:300]}"
            _free(device)
            continue
        return {**result, "compile_mode": mode, "failed_modes": failures}
    raise RuntimeError(f"no compile mode ran: {failures}")


def run_hf(
    model_dir: Path,
    prompts: list[list[int]],
    args: argparse.Namespace,
    device: str,
    warmup_full: bool = False,
    **generate_kwargs: Any,
) -> dict[str, Any]:
    """HF transformers ``generate`` over the prompts in batches of ``max_num_seqs``."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="sdpa"
    ).to(device)
    model.eval()
    kwargs = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.output_len,
        min_new_tokens=args.output_len,
        pad_token_id=0,
        **generate_kwargs,
    )

    def generate(batch: list[list[int]], max_new: int) -> int:
        ids = torch.tensor(batch, device=device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                **{**kwargs, "max_new_tokens": max_new, "min_new_tokens": max_new},
            )
        return int(out.shape[0] * (out.shape[1] - ids.shape[1]))

    generate(
        prompts[: min(len(prompts), args.max_num_seqs)], args.output_len if warmup_full else 4
    )  # warm-up
    _sync(device)
    start = time.perf_counter()
    num_out = sum(
        generate(prompts[i : i + args.max_num_seqs], args.output_len)
        for i in range(0, len(prompts), args.max_num_seqs)
    )
    _sync(device)
    elapsed = time.perf_counter() - start
    return {
        "seconds": round(elapsed, 3),
        "output_tokens": num_out,
        "output_tokens_per_s": round(num_out / elapsed, 1),
    }


def bandwidth_floor(mc: ModelConfig, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    """Seconds and tokens/s if every decode step only read its weights and KV cache at
    ``bandwidth`` (prefill and compute ignored: a lower bound on the time)."""
    dtype = getattr(torch, args.dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    d, h, kv, i, v, layers = (
        mc.hidden_size,
        mc.num_attention_heads,
        mc.num_key_value_heads,
        mc.intermediate_size,
        mc.vocab_size,
        mc.num_hidden_layers,
    )
    per_layer = d * (h + 2 * kv) * mc.head_dim + h * mc.head_dim * d + 3 * d * i
    weight_bytes = (layers * per_layer + v * d * (1 if mc.tie_word_embeddings else 2)) * elem
    kv_per_token = kv_cache_bytes_per_block(mc, 1, dtype)
    num_batches = math.ceil(args.num_prompts / args.max_num_seqs)
    decode_steps = num_batches * args.output_len
    # Each request reads its context (prompt + tokens so far) at each of its decode steps.
    kv_bytes = (
        args.num_prompts * kv_per_token * sum(args.prompt_len + j for j in range(args.output_len))
    )
    total = weight_bytes * decode_steps + kv_bytes
    seconds = total / bandwidth
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "bytes_read": total,
        "weight_bytes": weight_bytes,
        "seconds": round(seconds, 4),
        "output_tokens_per_s": round(args.num_prompts * args.output_len / seconds, 1),
    }


def device_bandwidth(args: argparse.Namespace, device: str) -> tuple[float, str]:
    if args.bandwidth_tbps is not None:
        return args.bandwidth_tbps * 1e12, "given"
    if device == "cuda":
        name = torch.cuda.get_device_name()
        for key, value in SPEC_BANDWIDTH.items():
            if key in name:
                return value, f"datasheet ({name})"
        return measured_copy_bandwidth(), f"measured copy ({name})"
    return 20e9, "nominal CPU"


def measured_copy_bandwidth() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    end.synchronize()
    return 10 * 2 * x.numel() / (start.elapsed_time(end) / 1e3)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def print_failure(exc: Exception) -> None:
    """A contender's failure on stderr: its traceback, except for a library that is not
    installed (transformers for ``hf``), which the one-line result names well enough."""
    if not isinstance(exc, ImportError):  # ModuleNotFoundError is one
        traceback.print_exception(exc)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = "cpu" if args.quick or not torch.cuda.is_available() else "cuda"
    hf_config = QUICK_CONFIG if args.quick else json.loads(QWEN3_06B.read_text())["config"]
    mc = ModelConfig.from_hf_dict(hf_config)
    prompts = make_prompts(args.num_prompts, args.prompt_len, mc.vocab_size, args.seed)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_weights(
            hf_config, Path(tmp) / "model", dtype=getattr(torch, args.dtype), seed=args.seed
        )
        for runner in args.runners.split(","):
            name = {"hf": "hf_generate", "hf-compiled": "hf_generate_compiled"}.get(
                runner, f"runner_{runner}"
            )
            print(f"running {name} ...", flush=True)
            try:
                if runner == "hf":
                    results[name] = run_hf(model_dir, prompts, args, device)
                elif runner == "hf-compiled":
                    results[name] = run_hf_compiled(model_dir, prompts, args, device)
                elif runner == "v2-unfused":
                    with unfused_ops():
                        results[name] = run_engine("v2", model_dir, prompts, args, device)
                elif runner == "v2-serial":
                    with serial_attention():
                        results[name] = run_engine("v2", model_dir, prompts, args, device)
                else:
                    results[name] = run_engine(runner, model_dir, prompts, args, device)
            except Exception as exc:  # one contender failing still reports the others
                print_failure(exc)
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            _free(device)  # the HF model went with run_hf's frame; engines were deleted
            print(f"  {name}: {results[name]}", flush=True)
    bandwidth, source = device_bandwidth(args, device)
    floor = bandwidth_floor(mc, args, bandwidth)
    floor["bandwidth_source"] = source
    speeds = {k: v["output_tokens_per_s"] for k, v in results.items() if "error" not in v}
    ratios = {f"{a}/{b}": round(speeds[a] / speeds[b], 3) for a in speeds for b in speeds if a != b}
    summary = {
        "benchmark": "throughput",
        "quick": args.quick,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "model": "tiny qwen3" if args.quick else "Qwen3-0.6B shape, random weights",
        "dtype": args.dtype,
        "num_prompts": args.num_prompts,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "results": results,
        "ratios": ratios,
        "bandwidth_floor": floor,
        "fraction_of_floor": {
            k: round(v / floor["output_tokens_per_s"], 3) for k, v in speeds.items()
        },
        "torch": torch.__version__,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
