"""Where a steady runner_v2 decode step's wall time goes when it exceeds the device's (GPU).

runner_v2 schedules asynchronously: ``EngineCore.step()`` plans and launches step N+1, then
waits for step N's results. The GPU stays busy only while the host's work of a step (update,
schedule, launch) takes less than the device's time of the step before; the rest is idle GPU.
This benchmark measures, at ``num_reqs`` steady decodes on the Qwen3-0.6B shape (random bf16
weights, 512-token prompts), in one process:

- ``phases``: the host's time per step in each phase (``schedule``, ``execute_model`` and its
  parts, the wait for the results' event, the assembly of ``ModelRunnerOutput``,
  ``update_from_output``), from ``perf_counter`` around each call, no profiler on;
- ``gpu``: from a ``torch.profiler`` trace of unsynchronised steps (CUDA activity only), the
  fraction of the wall time with a kernel or copy running and the longest idle gaps;
- ``launch_us``: the host's cost of one launch of a Triton input kernel, a torch op and a graph
  replay (back to back, no sync), the unit costs behind the ``execute_model`` figure;
- ``cprofile``: the functions with the most own time per step.

Run: python3 -P benchmarks/host_gap.py [--num-reqs 256] [--trace trace.json]
-> last line: one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))

from benchmarks.layer_ops import add_random_requests, qwen3_engine  # noqa: E402
from benchmarks.step_timing import result_waits  # noqa: E402
from benchmarks.throughput import QWEN3_06B  # noqa: E402


def steady_engine(model_dir: Path, num_reqs: int, num_warm_steps: int = 40) -> Any:
    """An EngineCore on runner_v2 with ``num_reqs`` requests of 512 random prompt tokens
    (``max_tokens`` 400), stepped past their prefill into steady decode (as layer_ops' profile)."""
    core = qwen3_engine(model_dir, num_reqs)
    add_random_requests(core, 0, num_reqs, torch.Generator().manual_seed(0))
    for _ in range(num_warm_steps):
        core.step()
    torch.cuda.synchronize()
    return core


@contextmanager
def _timers(core: Any) -> Iterator[dict[str, float]]:
    # Wraps the calls of one async step with perf_counter; totals in seconds by phase. The wait
    # for the results' event comes from step_timing.result_waits, the rest of get_output is
    # the output's assembly.
    import turnout.runner_v2.async_output as async_output
    import turnout.runner_v2.runner as runner_mod

    totals: dict[str, float] = defaultdict(float)
    patched: list[tuple[Any, str, Any]] = []  # owner, name, what its own __dict__ held (or _ABSENT)

    def wrap(owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[phase] += time.perf_counter() - t0

        patched.append((owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, timed)

    runner = core.runner
    wrap(core.scheduler, "schedule", "schedule")
    wrap(core.scheduler, "update_from_output", "update_from_output")
    wrap(runner, "execute_model", "execute_model")
    for name in ("_update_states", "_prepare", "_forward", "_sample"):
        wrap(runner, name, f"execute_model.{name.lstrip('_')}")
    for name in ("upload_step", "post_update", "AsyncOutput"):
        wrap(runner_mod, name, f"execute_model.{name}")
    with result_waits() as waits:  # restores get_output last, after the wrappers below are gone
        wrap(async_output.AsyncOutput, "get_output", "collect_output")
        try:
            yield totals
            totals["wait_for_results"] = sum(waits)
            totals["assemble_output"] = (
                totals.pop("collect_output", 0.0) - totals["wait_for_results"]
            )
        finally:
            for owner, name, held in reversed(patched):
                if held is _ABSENT:
                    delattr(owner, name)  # the class's method again
                else:
                    setattr(owner, name, held)


#: Marks an attribute an object did not hold itself before a wrapper was set on it.
_ABSENT = object()


def phases(core: Any, num_steps: int) -> dict[str, Any]:
    """Host microseconds per step by phase over ``num_steps`` unsynchronised steps."""
    with _timers(core) as totals:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(num_steps):
            core.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    top = {"schedule", "execute_model", "wait_for_results", "assemble_output", "update_from_output"}
    per_step = {k: round(v / num_steps * 1e6, 1) for k, v in sorted(totals.items())}
    per_step["loop_and_rest"] = round(
        (wall - sum(v for k, v in totals.items() if k in top)) / num_steps * 1e6, 1
    )
    return {
        "wall_us_per_step": round(wall / num_steps * 1e6, 1),
        "host_busy_us_per_step": round((wall - totals["wait_for_results"]) / num_steps * 1e6, 1),
        "us_per_step": per_step,
    }


def gpu_busy(core: Any, num_steps: int, trace: Path | None) -> dict[str, Any]:
    """The fraction of ``num_steps`` unsynchronised steps' device span with work on the GPU."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            core.step()
        torch.cuda.synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    if not spans:
        return {"error": "the profiler recorded no device activity"}
    busy, gaps, end = 0.0, [], spans[0][0]
    for s, e in spans:
        if s > end:
            gaps.append(s - end)
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    span = end - spans[0][0]
    gaps.sort(reverse=True)
    return {
        "device_span_us_per_step": round(span / num_steps, 1),
        "busy_fraction": round(busy / span, 4),
        "idle_us_per_step": round((span - busy) / num_steps, 1),
        "num_gaps_over_20us": sum(g > 20 for g in gaps),
        "longest_gaps_us": [round(g, 1) for g in gaps[:10]],
    }


def _host_us(fn: Callable[[], Any], iters: int = 300) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return round(dt / iters * 1e6, 2)


def launch_costs(core: Any) -> dict[str, float]:
    """Host microseconds per launch, back to back without a sync."""
    from turnout.kernels.query_start_loc import prepare_query_start_loc

    runner = core.runner
    n = len(core.scheduler.running)
    num_sched = torch.ones(n, dtype=torch.int32, device="cuda")
    qsl = torch.zeros(n + 1, dtype=torch.int32, device="cuda")
    x = torch.zeros(n, 1024, dtype=torch.bfloat16, device="cuda")
    idx = torch.arange(n, device="cuda")
    graphs = runner.graphs.decode
    size = graphs.padded_size(n)
    return {
        "triton_prepare_query_start_loc": _host_us(
            lambda: prepare_query_start_loc(num_sched, n, qsl)
        ),
        "torch_index_select": _host_us(lambda: x.index_select(0, idx)),
        "decode_graph_replay": _host_us(lambda: graphs.replay(size), iters=50),
    }


def cprofile_top(core: Any, num_steps: int, limit: int = 25) -> list[dict[str, Any]]:
    """The ``limit`` functions with the most own time per step under cProfile."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(num_steps):
        core.step()
    torch.cuda.synchronize()
    prof.disable()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:limit]  # type: ignore[attr-defined]
    return [
        {
            "function": f"{Path(f).name}:{line}:{name}",
            "calls_per_step": round(nc / num_steps, 1),
            "tottime_us_per_step": round(tt / num_steps * 1e6, 1),
            "cumtime_us_per_step": round(ct / num_steps * 1e6, 1),
        }
        for (f, line, name), (_cc, nc, tt, ct, _callers) in rows
    ]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        description="Where a steady runner_v2 decode step's wall time goes (needs a CUDA "
        "device): host phases, GPU busy fraction, launch costs, cProfile."
    )
    p.add_argument(
        "--num-reqs",
        type=_positive_int,
        default=256,
        help="running requests in the steady decode (default 256)",
    )
    p.add_argument(
        "--num-steps",
        type=_positive_int,
        default=60,
        help="steps timed per measurement (default 60)",
    )
    p.add_argument(
        "--trace", type=Path, default=None, help="write the profiler's chrome trace here"
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/host_gap.py needs a CUDA device")
    from turnout.engine.model import write_random_weights

    summary: dict[str, Any] = {
        "benchmark": "host_gap",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "num_reqs": args.num_reqs,
    }
    with tempfile.TemporaryDirectory() as tmp:
        hf = json.loads(QWEN3_06B.read_text())["config"]
        model_dir = write_random_weights(hf, Path(tmp) / "model", dtype=torch.bfloat16, seed=0)
        core = steady_engine(model_dir, args.num_reqs)
        for name, fn in (
            ("phases", lambda: phases(core, args.num_steps)),
            ("gpu", lambda: gpu_busy(core, 20, args.trace)),
            ("launch_us", lambda: launch_costs(core)),
            ("cprofile", lambda: cprofile_top(core, args.num_steps)),
        ):
            summary[name] = fn()
            print(name, summary[name], flush=True)
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
