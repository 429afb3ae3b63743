"""Host cost of the engine's scheduler path per step, on the CPU (no model, no device).

The real :class:`~engine.scheduler.Scheduler` (with its KV cache manager and requests) is driven
the way ``EngineCore`` drives it under asynchronous scheduling (runner_v2): ``schedule()`` of
step N+1, then ``update_from_output()`` of step N. A stand-in runner returns a
:class:`~engine.outputs.ModelRunnerOutput` with one sampled token per request whose scheduled
tokens reach the end of its known tokens (``[]`` for a partial prefill), as a runner does.

Cases (both seeded, so the scheduler's decisions are the same on every run; ``digest`` is a
hash of every step's plan and finished requests, to compare before and after a change):

- ``decode``: ``--num-reqs`` requests (256) with ``--prompt-len``-token prompts (512) are
  prefilled, then ``--steps`` steady decode steps (every request running, one token each) are
  timed (the Qwen3-0.6B serving shape: ``max_num_seqs`` 256, ``max_num_batched_tokens`` 8192);
- ``mixed``: requests of random prompt lengths (128..8192) and ``max_tokens`` (32..512) keep
  arriving, so each step carries prompt chunks (chunked prefill) beside the decodes;
- ``decode_core``: the ``decode`` case through ``EngineCore.step()`` (the engine loop's own
  bookkeeping included), less the stand-in runner's time: ``total_us`` only.

Per case: µs per step of ``schedule()``, of ``update_from_output()`` and their sum, each the
median over ``--repeats`` runs of the mean over the timed steps; the stand-in runner is not
timed. The times are the thread's CPU time (``time.thread_time_ns``: steadier than the wall on
a shared host); ``wall_total_us`` is the same sum on the wall clock. Prefix caching is off
unless ``--prefix-caching``; ``--sync`` drives the synchronous loop (runner_v1).

    python benchmarks/scheduler_host.py                 # both cases, 10-60 s by the host's load
    python benchmarks/scheduler_host.py --repeats 3 --steps 100

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))

from turnout.engine.config import EngineConfig  # noqa: E402
from turnout.engine.outputs import ModelRunnerOutput  # noqa: E402
from turnout.engine.request import Request  # noqa: E402
from turnout.engine.sampling_params import SamplingParams  # noqa: E402
from turnout.engine.scheduler import Scheduler  # noqa: E402
from turnout.engine.scheduler_output import SchedulerOutput  # noqa: E402

VOCAB = 151_936
EOS = 151_645
SAMPLED = 42  # every sampled token (never EOS: requests stop on max_tokens or max_model_len)


class StandInRunner:
    """Tracks how many tokens each request has (prompt, resumed list, sampled ones) and samples
    one token for each request whose scheduled tokens reach the last of them."""

    def __init__(self) -> None:
        self.num_known: dict[str, int] = {}

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        known = self.num_known
        for req_id in so.finished_req_ids:
            known.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            known[new.req_id] = len(new.prompt_token_ids)
        cached = so.scheduled_cached_reqs
        num_computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for i, req_id in enumerate(cached.req_ids):
            token_ids = cached.resumed_req_token_ids[i]
            if token_ids is not None:
                known[req_id] = len(token_ids)
        for new in so.scheduled_new_reqs:
            num_computed[new.req_id] = new.num_computed_tokens
        req_ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id, num in so.num_scheduled_tokens.items():
            if num_computed[req_id] + num >= known[req_id]:
                known[req_id] += 1
                sampled.append([SAMPLED])
            else:
                sampled.append([])
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)


class Workload:
    """Seeded arrivals: ``decode`` adds every request at once; ``mixed`` keeps a few waiting."""

    def __init__(self, case: str, args: argparse.Namespace, seed: int = 0) -> None:
        self.case = case
        self.args = args
        self.rng = random.Random(seed)
        self.num_added = 0

    def config(self) -> EngineConfig:
        a = self.args
        max_model_len = a.prompt_len + 2 * a.steps + 256 if self.case == "decode" else 8192 + 512
        return EngineConfig(
            model="stand-in",
            vocab_size=VOCAB,
            max_model_len=max_model_len,
            eos_token_ids=(EOS,),
            max_num_seqs=a.num_reqs,
            max_num_batched_tokens=a.max_num_batched_tokens,
            enable_prefix_caching=a.prefix_caching,
        )

    def num_blocks(self, config: EngineConfig) -> int:
        # Room for every request at its longest: the cases measure scheduling, not preemption.
        return self.args.num_reqs * config.max_num_blocks_per_req + 64

    def top_up(self, scheduler: Scheduler) -> None:
        if self.case == "decode":
            while self.num_added < self.args.num_reqs:
                self._add(scheduler, self.args.prompt_len, 1 << 30)
            return
        while len(scheduler.waiting) < 4:
            self._add(scheduler, self.rng.randint(128, 8192), self.rng.randint(32, 512))

    def _add(self, scheduler: Scheduler, prompt_len: int, max_tokens: int) -> None:
        rng = self.rng
        prompt = [rng.randrange(1, VOCAB - 1) for _ in range(prompt_len)]
        params = SamplingParams(max_tokens=max_tokens, seed=self.num_added)
        scheduler.add_request(
            Request(
                req_id=f"r{self.num_added}",
                prompt_token_ids=prompt,
                sampling_params=params,
                arrival_index=self.num_added,
                eos_token_ids=frozenset({EOS}),
            )
        )
        self.num_added += 1


def _fold(digest: Any, so: SchedulerOutput, finished: list[Request]) -> None:
    cached = so.scheduled_cached_reqs
    digest.update(
        repr(
            (
                sorted(so.num_scheduled_tokens.items()),
                [n.block_ids for n in so.scheduled_new_reqs],
                cached.req_ids,
                cached.new_block_ids,
                cached.num_computed_tokens,
                cached.num_output_tokens,
                sorted(so.preempted_req_ids),
                sorted(so.finished_req_ids),
                [(r.req_id, r.status.value, r.num_output_tokens) for r in finished],
            )
        ).encode()
    )


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run: warm up to the steady state, then time ``args.steps`` steps."""
    work = Workload(case, args)
    config = work.config()
    scheduler = Scheduler(config, work.num_blocks(config), async_scheduling=not args.sync)
    runner = StandInRunner()
    digest = hashlib.sha256()
    warmup = args.warmup if case == "decode" else args.warmup + 300
    in_flight: tuple[SchedulerOutput, ModelRunnerOutput] | None = None
    t_sched = t_update = wall = 0
    num_tokens = num_decodes = 0
    gc.collect()
    clock, wall_clock = time.thread_time_ns, time.perf_counter_ns
    for step in range(warmup + args.steps):
        timed = step >= warmup
        work.top_up(scheduler)
        w0, t0 = wall_clock(), clock()
        so = scheduler.schedule()
        t1, w1 = clock(), wall_clock()
        output = runner.execute_model(so)
        if timed:
            t_sched += t1 - t0
            wall += w1 - w0
            num_tokens += so.total_num_scheduled_tokens
            num_decodes += sum(1 for n in so.num_scheduled_tokens.values() if n == 1)
        previous = in_flight if not args.sync else (so, output)
        in_flight = (so, output) if not args.sync else None
        if previous is None:
            continue
        w2, t2 = wall_clock(), clock()
        finished = scheduler.update_from_output(*previous)
        t3, w3 = clock(), wall_clock()
        if timed:
            t_update += t3 - t2
            wall += w3 - w2
        _fold(digest, previous[0], finished)
    if case == "decode":
        assert num_decodes == args.steps * args.num_reqs, (
            "the decode case must time steady decode steps only"
        )
    n = args.steps
    return {
        "schedule_us": t_sched / n / 1e3,
        "update_us": t_update / n / 1e3,
        "total_us": (t_sched + t_update) / n / 1e3,
        "wall_total_us": wall / n / 1e3,
        "tokens_per_step": num_tokens / n,
        "decodes_per_step": num_decodes / n,
        "digest": digest.hexdigest()[:16],
    }


class TimedRunner(StandInRunner):
    """The stand-in runner behind an ``EngineCore``: counts its own CPU time (not the engine's)."""

    async_scheduling = True

    def __init__(self, async_scheduling: bool) -> None:
        super().__init__()
        self.async_scheduling = async_scheduling
        self.cpu_ns = 0
        self.outputs: list[SchedulerOutput] = []

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        t0 = time.thread_time_ns()
        out = super().execute_model(so)
        self.outputs.append(so)
        self.cpu_ns += time.thread_time_ns() - t0
        return out


def run_core_case(args: argparse.Namespace) -> dict[str, Any]:
    """The decode case through ``EngineCore.step()`` (its bookkeeping included), less the
    stand-in runner's own time."""
    from turnout.engine.core import EngineCore

    work = Workload("decode", args)
    config = work.config()
    runner = TimedRunner(not args.sync)
    core = EngineCore(config, runner, work.num_blocks(config), async_scheduling=not args.sync)  # type: ignore[arg-type]
    work.top_up(core.scheduler)
    digest = hashlib.sha256()
    cpu = wall = 0
    gc.collect()
    for step in range(args.warmup + args.steps):
        runner.cpu_ns = 0
        w0, t0 = time.perf_counter_ns(), time.thread_time_ns()
        finished = core.step()
        t1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        if step >= args.warmup:
            cpu += t1 - t0 - runner.cpu_ns
            wall += w1 - w0 - runner.cpu_ns
        _fold(digest, runner.outputs.pop(0) if runner.outputs else SchedulerOutput(), finished)
    n = args.steps
    return {
        "total_us": cpu / n / 1e3,
        "wall_total_us": wall / n / 1e3,
        "digest": digest.hexdigest()[:16],
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    digests = {r["digest"] for r in runs}
    assert len(digests) == 1, f"the seeded workload scheduled differently across repeats: {digests}"
    keys = (
        "schedule_us",
        "update_us",
        "total_us",
        "wall_total_us",
        "tokens_per_step",
        "decodes_per_step",
    )
    out: dict[str, Any] = {
        k: round(statistics.median(r[k] for r in runs), 1) for k in keys if k in runs[0]
    }
    out["total_us_all_repeats"] = [round(r["total_us"], 1) for r in runs]
    out["digest"] = runs[0]["digest"]
    return out


def main() -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="decode,mixed,decode_core")
    p.add_argument(
        "--num-reqs", type=int, default=256, help="max_num_seqs (and the decode case's requests)"
    )
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=300, help="timed steps per repeat")
    p.add_argument(
        "--warmup", type=int, default=40, help="untimed steps first (the mixed case adds 300)"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument(
        "--sync", action="store_true", help="synchronous loop (runner_v1) instead of async"
    )
    args = p.parse_args()
    summary: dict[str, Any] = {
        "benchmark": "scheduler_host",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "async_scheduling": not args.sync,
        "prefix_caching": args.prefix_caching,
        "num_reqs": args.num_reqs,
        "steps": args.steps,
        "repeats": args.repeats,
        "cases": {},
    }
    for case in args.cases.split(","):
        runs = [
            run_core_case(args) if case == "decode_core" else run_case(case, args)
            for _ in range(args.repeats)
        ]
        summary["cases"][case] = summarise(runs)
        print(case, summary["cases"][case], flush=True)
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
