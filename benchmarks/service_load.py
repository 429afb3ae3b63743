"""Load benchmark of the rollout-control service (docs/architecture.md §6, issues 3 and 13).

1. Side by side with a base commit (``--base REV``, e.g. ``main`` or ``HEAD~3``): the base's
   source (``git archive``) and the current tree each serve a fresh database, one after the
   other, alternating the order each round, with the same inputs on the same machine:
   - ``POST /api/v1/decide``: requests/s and p50/p99 at ``--concurrency`` keep-alive clients;
   - ingest: events/s through ``POST /api/v1/decisions`` in batches of ``--batch``;
   per backend (``--backends``), the median of ``--rounds`` runs each, and current / base.
2. The fleet (``--fleet 1000000,10000000``): for each size and backend a fresh database is
   bulk-loaded (benchmarks/fleet_load.py), then the fallback-reasons page and its API are timed
   (p50/p99 over ``--page-requests``, every window), and an ingest through the API on top.
3. ``oracle.client`` with the service down (refused connection; a listener that never answers).

Requests are real: the recipes' ``vllm serve`` lines as deployment specs, and events made from
their oracle decisions. The load comes from a raw asyncio HTTP/1.1 client on the same cores.
The last line printed is one JSON object.

    .venv/bin/python benchmarks/service_load.py --base main                   # 1 and 3
    .venv/bin/python benchmarks/service_load.py --base main --fleet 1000000,10000000
    .venv/bin/python benchmarks/service_load.py --quick --base HEAD~1          # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Its siblings import by name: under -P (PYTHONSAFEPATH) the script's folder is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_load
import load_client as lc

ROOT = lc.ROOT


def calibration_us() -> float:
    """Best of 200 timings of ``sum(range(1000))``: about 6 us on an idle core of this class;
    larger means other work shares the CPU (every figure then reads lower than idle)."""
    best = float("inf")
    for _ in range(200):
        t0 = time.perf_counter()
        sum(range(1000))
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e6, 1)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def export_base(rev: str, into: Path) -> str:
    """The source of ``rev`` under ``into`` (``git archive``: the repository is not touched);
    returns its commit."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def one_run(
    tree: Path,
    backend: str,
    args: argparse.Namespace,
    inputs: dict[str, Any],
    tmp: Path,
    label: str,
) -> dict[str, Any]:
    """Decide load and a timed ingest against ``tree``'s service on a fresh database."""
    fresh = lc.fresh_database(backend, tmp)
    try:
        tokens = lc.create_tokens(tree, fresh.url)
        svc = lc.start_service(tree, fresh.url, tmp / f"{label}.log", args.workers)
        try:
            decide = asyncio.run(
                lc.decide_load(
                    svc.port,
                    tokens["viewer"],
                    inputs["bodies"],
                    args.concurrency,
                    2.0,
                    args.decide_seconds,
                )
            )
            ingest = asyncio.run(
                lc.ingest(
                    svc.port, tokens["operator"], inputs["batches"], args.batch, args.ingest_clients
                )
            )
        finally:
            svc.stop()
    finally:
        fresh.drop()
    print(
        f"  {label}: decide {decide['req_per_s']}/s p99 {decide['p99_ms']} ms, "
        f"ingest {ingest['events_per_s']}/s",
        file=sys.stderr,
    )
    return {"decide": decide, "ingest": ingest}


def _median(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "decide_req_per_s": statistics.median(r["decide"]["req_per_s"] for r in runs),
        "decide_p50_ms": statistics.median(r["decide"]["p50_ms"] for r in runs),
        "decide_p99_ms": statistics.median(r["decide"]["p99_ms"] for r in runs),
        "ingest_events_per_s": statistics.median(r["ingest"]["events_per_s"] for r in runs),
    }


def side_by_side(args: argparse.Namespace, inputs: dict[str, Any], tmp: Path) -> dict[str, Any]:
    if args.rounds == 0:
        return {}
    trees = {"current": ROOT}
    out: dict[str, Any] = {
        "current": f"working tree at {git('rev-parse', 'HEAD')}"
        + (" (uncommitted changes)" if git("status", "--porcelain") else ""),
        "rounds": args.rounds,
    }
    if args.base:
        out["base"] = export_base(args.base, tmp / "base")
        trees = {"base": tmp / "base", "current": ROOT}
    for backend in args.backends:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))  # ABBA
            for name in order:
                runs[name].append(
                    one_run(trees[name], backend, args, inputs, tmp, f"{backend}-{name}-{r}")
                )
        result: dict[str, Any] = {name: _median(rs) for name, rs in runs.items()}
        result["runs"] = runs
        if "base" in trees:
            result["current_over_base"] = {
                k: round(result["current"][k] / result["base"][k], 3)
                for k in result["current"]
                if result["base"][k]
            }
        out[backend] = result
    return out


def client_offline_ms(tmp: Path) -> dict[str, float]:
    from turnout.oracle import from_spec
    from turnout.oracle.client import OracleClient

    config = from_spec({"architecture": "Qwen3ForCausalLM"})
    out = {}
    refused = f"http://127.0.0.1:{lc.free_port()}"
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        silent = f"http://127.0.0.1:{hole.getsockname()[1]}"
        for name, url in (("refused", refused), ("no_answer", silent)):
            client = OracleClient(
                url, "tok_x", cache_dir=tmp / f"client-{name}", timeout_s=1.0
            ).start()
            t0 = time.perf_counter()
            client.decide(config, deployment_id="bench")
            out[f"decide_ms_{name}"] = round((time.perf_counter() - t0) * 1e3, 1)
            client.close(flush_timeout_s=0.5)  # before its spool directory goes
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--base", default="", help="git revision to measure beside the tree")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of each tree (alternating); 0: no decide and ingest runs",
    )
    ap.add_argument(
        "--backends", default="sqlite,postgresql", type=lambda s: [b for b in s.split(",") if b]
    )
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--decide-seconds", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument(
        "--ingest-events", type=int, default=200_000, help="events of each timed ingest"
    )
    ap.add_argument(
        "--deployments", type=int, default=20_000, help="deployments of the timed ingest's events"
    )
    ap.add_argument("--ingest-clients", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1, help="turnout serve --workers")
    ap.add_argument(
        "--fleet",
        default="",
        type=lambda s: [int(n) for n in s.split(",") if n],
        help="stored-event counts to time the fallback page at, e.g. 1000000,10000000",
    )
    ap.add_argument(
        "--events-per-deployment",
        type=int,
        default=50,
        help="the fleet's deployments: events / this",
    )
    ap.add_argument("--fleet-ingest-events", type=int, default=50_000)
    ap.add_argument("--page-requests", type=int, default=30)
    ap.add_argument(
        "--quick", action="store_true", help="short phases: a smoke run of the harness, not figures"
    )
    args = ap.parse_args()
    if args.quick:
        args.decide_seconds, args.ingest_events, args.rounds = 2.0, 10_000, 1
        args.page_requests, args.fleet_ingest_events = 5, 5_000
    return args


def goals(results: dict[str, Any]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for backend, sides in results["side_by_side"].items():
        if isinstance(sides, dict) and "current" in sides:
            cur = sides["current"]
            out[f"{backend}_decide_2000_per_s"] = cur["decide_req_per_s"] >= 2000
            out[f"{backend}_decide_p99_50ms"] = cur["decide_p99_ms"] <= 50
            out[f"{backend}_ingest_20000_per_s"] = cur["ingest_events_per_s"] >= 20000
    for backend, sizes in results.get("fleet", {}).items():
        for size, r in sizes.items():
            out[f"{backend}_{size}_fallbacks_p99_200ms"] = r["worst_p99_ms"] <= 200
    out["client_100ms"] = max(results["client_service_down"].values()) <= 100
    return out


def main() -> None:
    args = parse_args()
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.python_version()}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="minutes"),
        "load_average_start": load_average(),
        "calibration_us_start": calibration_us(),
    }
    decided = lc.decided_configs()
    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    inputs = {
        "bodies": lc.decide_bodies(decided),
        "batches": lc.event_batches(
            decided,
            args.ingest_events,
            args.batch,
            args.deployments,
            "t",
            t0,
            dt.timedelta(days=15),
        ),
    }
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        results["side_by_side"] = side_by_side(args, inputs, tmp)
        if args.fleet:
            results["fleet"] = {
                b: {str(n): fleet_load.measure(b, n, args, decided, tmp) for n in args.fleet}
                for b in args.backends
            }
        results["client_service_down"] = client_offline_ms(tmp)
    results["load_average_end"] = load_average()
    results["calibration_us_end"] = calibration_us()
    results["goals_met"] = goals(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
