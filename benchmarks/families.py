"""Output tokens/s of runner_v1 and runner_v2 for every model family beyond the dense decoders,
side by side in one run, at the configs' full layer counts (GPU, bf16).

Families (configs in ``policies/reference/model_configs/``): OPT (opt-125m), GraniteMoe
(granite-3.0-1b-a400m), Qwen2-MoE (qwen1.5-moe-a2.7b), Qwen3-MoE (qwen3-30b-a3b) and
DeepSeek-V2 with MLA (deepseek-v2-lite). Weights: ``load_format="dummy"`` (vLLM's
``--load-format dummy``): seeded random bf16 weights drawn on the GPU itself from
``config.json`` (Qwen3-30B-A3B's 61 GB would not fit the host's disk as a checkpoint).

Workload per family: ``--num-prompts`` prompts of ``--prompt-len`` random tokens, ``--output-len``
output tokens each (``ignore_eos``), ``max_num_seqs`` 128, ``max_num_batched_tokens`` 8192,
prefix caching off, default sampling (temperature 1). Each runner is built, warmed up (a short
pass; runner_v2 captures its decode CUDA graphs when it is built, not timed) and timed over one
pass; then freed before the next. Output tokens/s = output tokens / wall time of the pass.

    python benchmarks/families.py                    # the GPU run (a few minutes on an H200)
    python benchmarks/families.py --quick            # CPU smoke run: 2-layer shrunk configs
    python benchmarks/families.py --families opt-125m,qwen3-30b-a3b

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

from turnout.engine.model_info import engine_config_for  # noqa: E402
from turnout.engine.runner_loader import build_engine_core  # noqa: E402
from turnout.engine.sampling_params import SamplingParams  # noqa: E402

CONFIGS = ROOT / "policies" / "reference" / "model_configs"
FAMILIES = {
    "opt-125m": "OPT",
    "granite-3.0-1b-a400m": "GraniteMoe",
    "qwen1.5-moe-a2.7b": "Qwen2-MoE",
    "qwen3-30b-a3b": "Qwen3-MoE",
    "deepseek-v2-lite": "DeepSeek-V2 (MLA)",
}
# --quick: the structure kept (experts, shared experts, MLA ranks, dense first layer), sizes cut.
_SHRINK: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "ffn_dim": 96,
    "word_embed_proj_dim": 64,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2-layer shrunk configs on CPU (smoke run)")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma list of config names")
    p.add_argument("--runners", default="v1,v2", help="comma list of v1, v2")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.num_prompts, args.prompt_len, args.output_len = 6, 20, 4
        args.max_num_seqs, args.max_num_batched_tokens = 4, 64
    unknown = sorted(set(args.families.split(",")) - set(FAMILIES))
    if unknown:
        p.error(f"unknown families {unknown}; choose from {sorted(FAMILIES)}")
    return args


def hf_config(name: str, quick: bool) -> dict[str, Any]:
    """The family's config.json; shrunk to two small layers for ``--quick``."""
    config = dict(json.loads((CONFIGS / f"{name}.json").read_text())["config"])
    if not quick:
        return config
    config.update({k: v for k, v in _SHRINK.items() if k in config})
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if key in config:
            config[key] = min(config[key], 8)
    config["num_experts_per_tok"] = min(config.get("num_experts_per_tok", 2), 2)
    config["num_key_value_heads"] = (
        4 if config.get("num_key_value_heads") == config.get("num_attention_heads") else 2
    )
    if "head_dim" in config:
        config["head_dim"] = 16
    config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32")
    return config


def run_runner(
    runner: str, model_dir: Path, vocab_size: int, args: argparse.Namespace, device: str, dtype: str
) -> dict[str, Any]:
    core = build_engine_core(
        engine_config_for(
            model_dir,
            dtype=dtype,
            device=device,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.prompt_len + args.output_len,
            enable_prefix_caching=False,
            seed=args.seed,
            load_format="dummy",
        ),
        runner,
    )
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(
        3, vocab_size, (args.num_prompts, args.prompt_len), generator=gen
    ).tolist()
    for i, prompt in enumerate(prompts[: args.max_num_seqs]):
        core.add_request(f"warm{i}", prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    core.run_until_done()
    graphs_before = getattr(core.runner, "num_graph_steps", 0)
    steps_before = core.num_steps
    _sync(device)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        core.add_request(
            f"r{i}", prompt, SamplingParams(max_tokens=args.output_len, ignore_eos=True)
        )
    done = core.run_until_done()
    _sync(device)
    elapsed = time.perf_counter() - start
    num_out = sum(len(r.output_token_ids) for r in done)
    result = {
        "seconds": round(elapsed, 3),
        "output_tokens": num_out,
        "output_tokens_per_s": round(num_out / elapsed, 1),
        "steps": core.num_steps - steps_before,
    }
    if hasattr(core.runner, "num_graph_steps"):
        result["cuda_graph_steps"] = core.runner.num_graph_steps - graphs_before
    return result


def run_family(name: str, args: argparse.Namespace, device: str, dtype: str) -> dict[str, Any]:
    config = hf_config(name, args.quick)
    out: dict[str, Any] = {
        "family": FAMILIES[name],
        "num_hidden_layers": config["num_hidden_layers"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        for runner in args.runners.split(","):
            try:
                out[f"runner_{runner}"] = run_runner(
                    runner, Path(tmp), config["vocab_size"], args, device, dtype
                )
            except Exception as exc:  # one failing family/runner still reports the others
                traceback.print_exc()
                out[f"runner_{runner}"] = {"error": f"{type(exc).__name__}: {exc}"}
            _free(device)
            print(f"  {name} runner_{runner}: {out[f'runner_{runner}']}", flush=True)
    v1, v2 = (out.get(f"runner_{r}", {}).get("output_tokens_per_s") for r in ("v1", "v2"))
    if v1 and v2:
        out["v2_over_v1"] = round(v2 / v1, 3)
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
    dtype = "float32" if device == "cpu" else "bfloat16"
    results = {}
    for name in args.families.split(","):
        print(f"family {name} ...", flush=True)
        results[name] = run_family(name, args, device, dtype)
    summary = {
        "benchmark": "families",
        "quick": args.quick,
        "dtype": dtype,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "num_prompts": args.num_prompts,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "results": results,
        "torch": torch.__version__,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
