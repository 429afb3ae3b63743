"""Does the service stay responsive to engines and operators while others read and write hard?

Side by side in one run, on one bulk-loaded SQLite database and the same machine, the service
with the heavy-read bound (``TURNOUT_MAX_HEAVY_READS`` 2, 1 per token: the defaults), the same
with its heap not frozen (``TURNOUT_FREEZE_HEAP=0``: side ``unfrozen``) and without the bound
(1000, the old behaviour):

1. ``GET /api/v1/canaries`` (what an engine fetches at start-up, with a 0.5 s deadline): p50,
   p99 and the share over 0.5 s of ``--probes`` sequential probes, idle and then while
   ``--exports`` clients loop ``GET /api/v1/decisions.csv?window=all`` and ``--previews``
   clients loop ``GET /api/v1/upgrade-preview`` (each from its own viewer token; a 429 waits
   its Retry-After, as a client should);
2. the kill switch during ingest: ``--ingest-clients`` clients post batches of 5,000 events
   while an operator engages and releases the kill switch ``--flips`` times: each call's
   latency (the goal: at most 1 s).

The last line printed is one JSON object.

    .venv/bin/python benchmarks/fairness.py                       # 100,000 decisions
    .venv/bin/python benchmarks/fairness.py --decisions 430000 --exports 20 --previews 60
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_load
import load_client as lc

ROOT = lc.ROOT


def viewer_tokens(url: str, n: int) -> list[str]:
    """``n`` viewer tokens and one operator token (the last), made on the database."""
    names = [(f"viewer-{i}", "viewer") for i in range(n)] + [("operator", "operator")]
    made = lc._store_tokens(ROOT, url, names)
    return [made[name] for name, _role in names]


async def probe(port: int, token: str, n: int) -> dict[str, Any]:
    conn = lc.Conn("127.0.0.1", port)
    headers = {"Authorization": f"Bearer {token}"}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _body = await conn.request("GET", "/api/v1/canaries", headers)
        times.append((time.perf_counter() - t0) * 1e3)
        assert status == 200, status
        await asyncio.sleep(0.02)
    conn.close()
    return {
        "p50_ms": round(lc.percentile(times, 0.5), 1),
        "p99_ms": round(lc.percentile(times, 0.99), 1),
        "over_500ms": sum(t > 500 for t in times),
        "probes": n,
    }


async def heavy_client(port: int, token: str, path: str, stop: asyncio.Event, counts: dict) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    while not stop.is_set():
        conn = lc.Conn("127.0.0.1", port)
        try:
            status, _body = await conn.request("GET", path, headers)
        finally:
            conn.close()
        counts[status] = counts.get(status, 0) + 1
        if status == 429:
            await asyncio.sleep(2)  # its Retry-After


async def storm(port: int, tokens: list[str], args: argparse.Namespace) -> dict[str, Any]:
    stop = asyncio.Event()
    counts: dict[int, int] = {}
    paths = ["/api/v1/decisions.csv?window=all"] * args.exports + [
        "/api/v1/upgrade-preview"
    ] * args.previews
    tasks = [
        asyncio.create_task(heavy_client(port, tokens[i % len(tokens)], p, stop, counts))
        for i, p in enumerate(paths)
    ]
    await asyncio.sleep(2)  # the storm under way
    probed = await probe(port, tokens[-1], args.probes)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {**probed, "heavy_answers": {str(k): v for k, v in sorted(counts.items())}}


async def kill_switch_under_ingest(
    port: int, operator: str, batches: list[bytes], args: argparse.Namespace
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {operator}", "Content-Type": "application/json"}
    ingest = asyncio.create_task(
        lc.ingest(port, operator, batches, args.batch, clients=args.ingest_clients)
    )
    await asyncio.sleep(0.5)
    times = []
    conn = lc.Conn("127.0.0.1", port)
    for i in range(args.flips):
        body = json.dumps({"engaged": i % 2 == 0, "reason": f"drill {i}"}).encode()
        t0 = time.perf_counter()
        status, answer = await conn.request("POST", "/api/v1/kill-switch", headers, body)
        times.append((time.perf_counter() - t0) * 1e3)
        assert status == 200, (status, answer[:200])
        await asyncio.sleep(0.2)
    conn.close()
    ingested = await ingest
    return {
        "max_ms": round(max(times), 1),
        "p50_ms": round(lc.percentile(times, 0.5), 1),
        "flips": len(times),
        "ingest": ingested,
    }


def one_side(
    name: str,
    bound: int,
    db: Path,
    tokens: list[str],
    batches: list[bytes],
    args: Any,
    *,
    freeze: bool = True,
) -> dict[str, Any]:
    url = f"sqlite:///{db}"
    os.environ["TURNOUT_FREEZE_HEAP"] = "1" if freeze else "0"
    os.environ["TURNOUT_MAX_HEAVY_READS"] = str(bound)
    os.environ["TURNOUT_MAX_HEAVY_READS_PER_TOKEN"] = str(1 if bound < 1000 else bound)
    service = lc.start_service(ROOT, url, db.with_suffix(f".{name}.log"))
    try:
        idle = asyncio.run(probe(service.port, tokens[-1], args.probes))
        busy = asyncio.run(storm(service.port, tokens, args))
        kill = asyncio.run(kill_switch_under_ingest(service.port, tokens[-1], batches, args))
    finally:
        service.stop()
    return {"canaries_idle": idle, "canaries_storm": busy, "kill_switch_under_ingest": kill}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--deployments", type=int, default=20_000)
    parser.add_argument("--exports", type=int, default=20)
    parser.add_argument("--previews", type=int, default=60)
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--flips", type=int, default=20)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--ingest-batches", type=int, default=20)
    parser.add_argument("--ingest-clients", type=int, default=2)
    parser.add_argument(
        "--bound", type=int, default=2, help="TURNOUT_MAX_HEAVY_READS of the bounded side"
    )
    parser.add_argument(
        "--sides",
        default="bounded,unbounded",
        help="which services to run: bounded (the defaults), unfrozen (the defaults but "
        "TURNOUT_FREEZE_HEAP=0), unbounded (1000 heavy reads)",
    )
    args = parser.parse_args()

    decided = lc.decided_configs()
    now = dt.datetime.now(dt.UTC)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="turnout-fairness-") as tmp:
        bounds = (("bounded", args.bound), ("unfrozen", args.bound), ("unbounded", 1000))
        wanted = [n.strip() for n in args.sides.split(",")]
        sides = [(n, b) for n, b in bounds if n in wanted]
        for name, bound in sides:
            db = Path(tmp) / f"{name}.db"
            fleet_load.bulk_load(f"sqlite:///{db}", decided, args.decisions, args.deployments, now)
            tokens = viewer_tokens(f"sqlite:///{db}", args.viewers)
            batches = lc.event_batches(
                decided,
                args.batch * args.ingest_batches,
                args.batch,
                args.deployments,
                f"fair-{name}",
                now,
                dt.timedelta(minutes=5),
            )
            results[name] = one_side(
                name, bound, db, tokens, batches, args, freeze=name != "unfrozen"
            )
            print(json.dumps({name: results[name]}), file=sys.stderr)
    empty = {
        "canaries_storm": {"p99_ms": None, "over_500ms": None},
        "kill_switch_under_ingest": {"max_ms": None},
    }
    b, u = results.get("bounded", empty), results.get("unbounded", empty)
    f = results.get("unfrozen", empty)
    summary = {
        "benchmark": "fairness",
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "date": now.date().isoformat(),
        "decisions": args.decisions,
        "exports": args.exports,
        "previews": args.previews,
        "canaries_p99_ms_storm": {
            "bounded": b["canaries_storm"]["p99_ms"],
            "unfrozen": f["canaries_storm"]["p99_ms"],
            "unbounded": u["canaries_storm"]["p99_ms"],
        },
        "canaries_over_500ms_storm": {
            "bounded": b["canaries_storm"]["over_500ms"],
            "unbounded": u["canaries_storm"]["over_500ms"],
        },
        "kill_switch_max_ms_under_ingest": {
            "bounded": b["kill_switch_under_ingest"]["max_ms"],
            "unfrozen": f["kill_switch_under_ingest"]["max_ms"],
            "unbounded": u["kill_switch_under_ingest"]["max_ms"],
        },
        "p99_ratio_unbounded_over_bounded": (
            round(u["canaries_storm"]["p99_ms"] / max(b["canaries_storm"]["p99_ms"], 0.1), 2)
            if u["canaries_storm"]["p99_ms"] is not None
            and b["canaries_storm"]["p99_ms"] is not None
            else None
        ),
        "goals": {
            "canaries_p99_le_100ms": (b["canaries_storm"]["p99_ms"] or 1e9) <= 100,
            "kill_switch_le_1s": (b["kill_switch_under_ingest"]["max_ms"] or 1e9) <= 1000,
        },
        "detail": results,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
