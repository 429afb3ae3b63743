"""Oracle speed on one core: decisions/s warm and cold, and the time to enumerate every cell.

    .venv/bin/python benchmarks/oracle_bench.py [--pack turnout|vllm-0.31,vllm-0.33|all] [--n 200000]

- warm: the same config decided again and again (the embedded call at steady state);
- warm_equal: equal but distinct config objects (a service deciding repeated requests);
- cold: fresh configs never decided before (random draws over the pack's closed domains and
  every architecture it decides; for the turnout pack, those its runners serve), after the process has decided five times as many other fresh configs
  (the outcome memo of a long-running process: the shapes of outcomes recur, the configs
  do not);
- cold_no_memo: fresh configs with every cache emptied before each decision (the full
  resolution, building the Decision from scratch);
- enumerate: the whole matrix of each pack measured (cells, seconds).

``--pack all`` measures every shipped pack (``oracle.paths.SHIPPED_PACKS``) in one run.

Prints human lines, then one JSON object on the last line. Timings come from time.perf_counter
over whole loops, best of --repeats runs; the process is pinned to one CPU where the OS allows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from typing import Any

from turnout.oracle import DeploymentConfig, decide, enumerate_matrix, load_pack
from turnout.oracle.config import CONFIG_FIELD_NAMES
from turnout.oracle.pack import Pack
from turnout.oracle.paths import SHIPPED_PACKS


def _pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"cpu {cpu}"
    return "not pinned"


def _fresh_configs(pack: Pack, n: int, seed: int) -> list[DeploymentConfig]:
    rng = random.Random(seed)
    # A pack with runner manifests refuses the architectures no runner serves before any rule
    # runs: draw from the served ones, the traffic whose decision is worth measuring.
    served = pack._data.served
    archs = sorted(
        set().union(*served.values()) & set(pack.architectures) if served else pack.architectures
    )
    dims = {
        d: v
        for d, v in pack.domains.items()
        if v
        and d in CONFIG_FIELD_NAMES  # fields only: not family, runner_pin, derived
        and d
        not in (
            "architecture",
            "is_moe",
            "attention_free",
            "use_mla",
            "is_multimodal",
            "is_encoder_decoder",
            "is_hybrid",
            "is_diffusion",
        )
    }
    out = []
    for i in range(n):
        fields: dict[str, Any] = {"architecture": rng.choice(archs), "deployment_id": f"d{i}"}
        for dim, domain in dims.items():
            if rng.random() < 0.15:
                fields[dim] = rng.choice(domain)
        out.append(DeploymentConfig(**fields))
    return out


def _calibration_us() -> float:
    """Best-of-5 time of sum(range(1000)) in microseconds: how fast this Python is right now
    (load from other processes on shared machines shows up here)."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _best_rate(runs: list[tuple[int, float]]) -> float:
    return max(_rate(n, t) for n, t in runs)


def bench_warm(pack: Pack, n: int, repeats: int) -> tuple[float, float]:
    cfg = DeploymentConfig(architecture="Qwen3ForCausalLM", speculative_method="ngram")
    decide(cfg, pack=pack)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            decide(cfg, pack=pack)
        runs.append((n, time.perf_counter() - t0))
    copies = [
        DeploymentConfig(architecture="Qwen3ForCausalLM", speculative_method="ngram")
        for _ in range(min(n, 50_000))
    ]
    equal_runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for c in copies:
            decide(c, pack=pack)
        equal_runs.append((len(copies), time.perf_counter() - t0))
    return _best_rate(runs), _best_rate(equal_runs)


def _clear(pack: Pack, *, memo: bool) -> None:
    # A benchmark measures the uncached paths on purpose.
    pack._caches.clear()
    pack._last = (None, None, None)
    if memo:
        pack._eval.memo.clear()
        pack._eval._selected.clear()


def bench_cold(pack: Pack, n: int, seed: int, repeats: int) -> tuple[float, float]:
    """(steady-state cold, caches-emptied cold): each run decides its own fresh configs."""
    _clear(pack, memo=True)
    for c in _fresh_configs(pack, 5 * n, seed + 1000):  # a long-running process's memo
        decide(c, pack=pack)
    runs, empty_runs = [], []
    for r in range(repeats):
        configs = _fresh_configs(pack, n, seed + r)
        _clear(pack, memo=False)
        t0 = time.perf_counter()
        for c in configs:
            decide(c, pack=pack)
        runs.append((len(configs), time.perf_counter() - t0))
        few = _fresh_configs(pack, n // 10, seed + 100 + r)
        t0 = time.perf_counter()
        for c in few:
            _clear(pack, memo=True)
            decide(c, pack=pack)
        empty_runs.append((len(few), time.perf_counter() - t0))
    return _best_rate(runs), _best_rate(empty_runs)


def bench_enumerate(name: str) -> dict[str, float]:
    pack = load_pack(name)
    _clear(pack, memo=True)
    t0 = time.perf_counter()
    cells = sum(1 for _ in enumerate_matrix(pack))
    return {"cells": cells, "seconds": round(time.perf_counter() - t0, 3)}


def bench_pack(name: str, n: int, repeats: int, seed: int) -> dict[str, Any]:
    """Warm, cold and enumeration figures of one pack."""
    pack = load_pack(name)
    warm, warm_equal = bench_warm(pack, n, repeats)
    n_cold = max(1000, n // 10)
    cold, cold_no_memo = bench_cold(pack, n_cold, seed, repeats)
    return {
        "warm_decisions_per_s": round(warm),
        "warm_equal_decisions_per_s": round(warm_equal),
        "cold_decisions_per_s": round(cold),
        "cold_no_memo_decisions_per_s": round(cold_no_memo),
        "n_cold": n_cold,
        "enumerate": bench_enumerate(name),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--pack", default="turnout", help="a pack, a comma list, or 'all' (every shipped pack)"
    )
    ap.add_argument("--n", type=int, default=200_000, help="decisions per warm measurement")
    ap.add_argument("--repeats", type=int, default=5, help="runs per figure (best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = list(SHIPPED_PACKS) if args.pack == "all" else args.pack.split(",")
    where = _pin_one_core()
    packs = {}
    for name in names:
        packs[name] = r = bench_pack(name, args.n, args.repeats, args.seed)
        e = r["enumerate"]
        print(
            f"{name}: warm {r['warm_decisions_per_s']:>11,} /s, warm (equal configs) "
            f"{r['warm_equal_decisions_per_s']:>9,} /s, cold {r['cold_decisions_per_s']:>9,} /s, "
            f"cold (caches emptied) {r['cold_no_memo_decisions_per_s']:>8,} /s, "
            f"enumerate {e['cells']:,} cells in {e['seconds']:.3f} s",
            flush=True,
        )
    result = {
        "packs": packs,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": where,
        "calibration_sum_range_1000_us": round(_calibration_us(), 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
