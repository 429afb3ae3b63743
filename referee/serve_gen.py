"""Seeded ``vllm serve`` deployments with real model configs, for the real-code referee.

A case is what an operator runs: a model folder holding a real ``config.json`` (the shipped
ones of policies/reference/model_configs), a ``vllm serve`` line with one to six of the flags
the runner selection and the config checks read, given values vLLM accepts at parse time, the
environment variables that steer the selection, and the device it runs on (platform and
compute capability). Nothing about the model is drawn: whether it is hybrid, multimodal, MLA
or a pooling model is what its config says, as it is for vLLM.

The flags are drawn only where the release's flag table has them (its flags.json), so each
release gets the lines its parser reads. The same ``(seed, release)`` always gives the same
cases. Pure standard library: the lines are made without vLLM.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL_CONFIGS = ROOT / "policies" / "reference" / "model_configs"
# Draft models for draft_model speculation: the same tokenizer family as the target.
DRAFTS = {"qwen3-8b": "qwen3-0.6b", "qwen3-30b-a3b": "qwen3-0.6b", "llama-3.1-8b": "llama-3.1-8b"}
PLATFORMS = (("cuda", "9.0"),) * 6 + (
    ("cuda", "8.0"),
    ("cuda", "8.9"),
    ("cuda", "10.0"),
    ("cuda", "12.0"),
    ("rocm", "9.4"),
    ("rocm", "9.4"),
)  # ROCm only as MI300X: vLLM reads the GPU's architecture once per process (referee.stand_in)
ENV_VALUES = ("0", "1", "0", "1", "true", "false", "")
SPEC_METHODS = ("ngram", "ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix", "medusa")
ALL2ALL = (
    "allgather_reducescatter",
    "deepep_low_latency",
    "deepep_high_throughput",
    "pplx",
    "naive",
    "flashinfer_all2allv",
    "nixl_ep",
)
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KV_CONNECTORS = ("NixlConnector", "LMCacheConnectorV1", "OffloadingConnector", "P2pNcclConnector")


@cache
def models() -> dict[str, dict[str, Any]]:
    """name -> config.json contents, for every shipped config that names its architecture and
    model type (the ones transformers can read from a folder)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(MODEL_CONFIGS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        config = data.get("config") if isinstance(data, dict) else None
        if isinstance(config, dict) and config.get("architectures") and config.get("model_type"):
            out[path.stem] = config
    return out


def write_models(folder: Path) -> dict[str, Path]:
    """Each model of :func:`models` as ``folder/<name>/config.json``; name -> folder."""
    out = {}
    for name, config in models().items():
        home = folder / name
        home.mkdir(parents=True, exist_ok=True)
        target = home / "config.json"
        text = json.dumps(config, indent=1, sort_keys=True)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        out[name] = home
    return out


# A flag's draw: (rng, model name, the flag's action in the release's table) -> words.
Flag = Callable[[random.Random, str, dict[str, Any]], list[str]]


def _choice(flag: str, *values: str) -> Flag:
    """One of ``values``; none given: one of the release's own choices for the flag."""
    return lambda r, _m, action: [flag, r.choice(values or action["choices"])]


def _switch(on: str, off: str) -> Flag:
    return lambda r, _m, _a: [r.choice((on, on, off))]


def _on(flag: str) -> Flag:
    return lambda _r, _m, _a: [flag]


def _speculative(r: random.Random, model: str, _action: dict[str, Any]) -> list[str]:
    method = r.choice(SPEC_METHODS)
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": r.choice((1, 2, 3, 5))}
    if method == "ngram":
        config["prompt_lookup_max"] = r.choice((2, 4))
    elif method in ("draft_model", "eagle", "eagle3", "medusa"):
        config["model"] = "{models}/" + DRAFTS.get(model, "qwen3-0.6b")
    if r.random() < 0.2:
        config["parallel_drafting"] = True
    if r.random() < 0.15:
        config["disable_padded_drafter_batch"] = True
    return ["--speculative-config", json.dumps(config)]


def _compilation(r: random.Random, _model: str, _action: dict[str, Any]) -> list[str]:
    config: dict[str, Any] = {}
    if r.random() < 0.6:
        config["mode"] = r.choice((0, 1, 2, 3))
    if r.random() < 0.6:
        config["cudagraph_mode"] = r.choice(CUDAGRAPH_MODES)
    return ["--compilation-config", json.dumps(config)]


def _kv_transfer(r: random.Random, _model: str, _action: dict[str, Any]) -> list[str]:
    config = {
        "kv_connector": r.choice(KV_CONNECTORS),
        "kv_role": r.choice(("kv_both",) * 3 + ("kv_producer", "kv_consumer")),
    }
    return ["--kv-transfer-config", json.dumps(config)]


def _hisparse(_r: random.Random, _model: str, _action: dict[str, Any]) -> list[str]:
    return ["--attention-config", json.dumps({"hisparse_config": {}})]


def _watermark(r: random.Random, _model: str, _action: dict[str, Any]) -> list[str]:
    # The default algorithm (gumbel); the algorithm and its options are not drawn.
    return ["--watermark-config", json.dumps({"key": r.randrange(1, 2**31)})]


# option string -> (weight, draw). Only options the release's table holds are drawn. The last
# five were added when the branch report (docs/referee-coverage.md) showed the selection's
# HiSparse and watermark tests and the post-init's performance mode never reached.
FLAGS: dict[str, tuple[float, Flag]] = {
    "--tensor-parallel-size": (4.0, _choice("-tp", "2", "4", "8")),
    "--pipeline-parallel-size": (2.5, _choice("-pp", "2", "4")),
    "--data-parallel-size": (2.0, _choice("-dp", "2", "4")),
    "--decode-context-parallel-size": (1.5, _choice("-dcp", "2", "4")),
    "--prefill-context-parallel-size": (1.5, _choice("-pcp", "2")),
    "--distributed-executor-backend": (
        2.0,
        _choice("--distributed-executor-backend", "mp", "ray", "uni", "external_launcher"),
    ),
    "--enable-expert-parallel": (2.0, _on("--enable-expert-parallel")),
    "--enable-eplb": (1.5, _on("--enable-eplb")),
    "--enable-dbo": (2.0, _on("--enable-dbo")),
    "--all2all-backend": (1.5, _choice("--all2all-backend", *ALL2ALL)),
    "--enforce-eager": (2.0, _on("--enforce-eager")),
    "--compilation-config": (2.5, _compilation),
    "--speculative-config": (4.0, _speculative),
    "--async-scheduling": (2.0, _switch("--async-scheduling", "--no-async-scheduling")),
    "--enable-prefix-caching": (
        1.5,
        _switch("--enable-prefix-caching", "--no-enable-prefix-caching"),
    ),
    "--mamba-cache-mode": (1.0, _choice("--mamba-cache-mode")),
    "--enable-lora": (1.5, _on("--enable-lora")),
    "--kv-transfer-config": (1.5, _kv_transfer),
    "--enable-batch-sharded-sampling": (0.7, _on("--enable-batch-sharded-sampling")),
    "--attention-config": (1.0, _hisparse),
    "--watermark-config": (1.0, _watermark),
    "--kv-sharing-fast-prefill": (1.0, _on("--kv-sharing-fast-prefill")),
    "--cpu-offload-gb": (0.7, _choice("--cpu-offload-gb", "4")),
    "--performance-mode": (0.5, _choice("--performance-mode")),
}


# Flags whose drawn value a release's parser takes only from this release on (the flag itself
# is older): HiSparse's attention config arrived in 0.30.
SINCE = {"--attention-config": (0, 30)}


def _actions(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o: a for a in table["actions"] for o in a["option_strings"]}


def generate(table: dict[str, Any], seed: int, count: int) -> Iterator[dict[str, Any]]:
    """``count`` cases ``{"id", "model", "argv", "env", "platform", "device_capability"}`` for
    the release of ``table`` (its flags.json). ``argv`` names the model as ``{models}/<name>``
    and speculative drafts the same way; the runner puts the folder of
    :func:`write_models` in their place."""
    rng = random.Random(f"serve:{seed}:{table['release']}")
    known = _actions(table)
    release = tuple(int(x) for x in table["release"].split("."))
    flags = [
        (name, w, draw)
        for name, (w, draw) in FLAGS.items()
        if name in known and release >= SINCE.get(name, (0, 0))
    ]
    names = sorted(models())
    for n in range(count):
        model = rng.choice(names)
        words: list[str] = []
        chosen = rng.choices(flags, [w for _, w, _ in flags], k=rng.randint(0, 6))
        for name, _, draw in {name: (name, w, d) for name, w, d in chosen}.values():
            words += draw(rng, model, known[name])
        env: dict[str, str] = {}
        if rng.random() < 0.3:
            env["VLLM_USE_V2_MODEL_RUNNER"] = rng.choice(ENV_VALUES)
        if rng.random() < 0.05:
            env["VLLM_BATCH_INVARIANT"] = "1"
        platform, capability = rng.choice(PLATFORMS)
        yield {
            "id": f"serve-{seed}-{n:05d}",
            "model": model,
            "argv": ["vllm", "serve", "{models}/" + model, *words],
            "env": env,
            "platform": platform,
            "device_capability": capability,
        }


def resolve(argv: list[str], folder: Path) -> list[str]:
    """``argv`` with ``{models}`` replaced by ``folder``."""
    return [w.replace("{models}", str(folder)) for w in argv]
