"""Part of benchmarks/service_load.py: a fleet of millions of stored decision events, loaded
through the store's bulk path (``dashboard/store/bulk.py``: events inserted as they are, each
deployment's latest decision and the aggregates advanced through ingest's own code; a test
checks that it leaves the tables batched ingest leaves), then the fallback page and API timed
on it by a ``turnout serve`` of the current tree.

The fleet turns over: over 30 days, deployment ``d`` reports while it is among the
``num_deployments / 2`` live at that moment (each lives for about 15 days), so latest
decisions are spread over the whole month, as in a fleet where deployments come and go.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

# Its siblings import by name: under -P (PYTHONSAFEPATH) the script's folder is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import load_client as lc

ROOT = lc.ROOT
SPAN = dt.timedelta(days=30)
PARTS = 1_000_000  # events per bulk call (one transaction each: bounded WAL and memory)
PAGES = ("/fallbacks", "/fallbacks?window=7d", "/fallbacks?window=1h")
APIS = (
    "/api/v1/fallbacks",
    "/api/v1/fallbacks?window=7d",
    "/api/v1/fallbacks?window=24h",
    "/api/v1/fallbacks?window=1h",
    "/api/v1/fallbacks?window=7d&family=llama",
)


class FleetEvent(NamedTuple):
    """What the store reads of an event (``events.EventLike``), cheap to make by millions."""

    event_id: str
    at: dt.datetime
    deployment_id: str
    host: str
    pack: str
    family: str
    runner: str | None
    mode: str
    stage: str | None
    reason_code: str
    rule_ids: tuple[str, ...]
    policy_digest: str
    config: dict[str, Any] | None
    demo: bool
    launch: Any = None  # how turnout launch started vLLM: none here (events.EventLike)


def fleet_events(
    decided: list[tuple[Any, Any]],
    first: int,
    num: int,
    total: int,
    num_deployments: int,
    now: dt.datetime,
    seed: int = 1,
) -> Iterator[FleetEvent]:
    """Events ``first`` .. ``first + num`` of a ``total``-event month ending at ``now``."""
    rng = random.Random(seed * 1_000_003 + first)
    start = now - SPAN
    step = SPAN / total
    live = max(1, num_deployments // 2)
    shapes = [
        (
            d.family or "unknown",
            d.runner,
            d.mode,
            d.stage,
            d.reason_code,
            tuple(r.rule_id for r in d.reasons),
            d.policy_digest,
        )
        for _c, d in decided
    ]
    for i in range(first, first + num):
        d = int(i / total * (num_deployments - live)) + int(rng.random() * live)
        family, runner, mode, stage, code, rules, digest = shapes[d % len(shapes)]
        yield FleetEvent(
            f"f{i:09d}",
            start + i * step,
            f"dep-{d:07d}",
            f"host-{d % 500:03d}",
            "turnout",
            family,
            runner,
            mode,
            stage,
            code,
            rules,
            digest,
            None,
            False,
        )


def bulk_load(
    url: str, decided: list[tuple[Any, Any]], total: int, num_deployments: int, now: dt.datetime
) -> dict[str, Any]:
    from turnout.dashboard.store.bulk import bulk_ingest
    from turnout.dashboard.store.db import Database

    db = Database(url)
    db.upgrade()
    t0 = time.perf_counter()
    for first in range(0, total, PARTS):
        num = min(PARTS, total - first)
        with db.write_session() as s:
            bulk_ingest(
                session=s,
                events=fleet_events(decided, first, num, total, num_deployments, now),
                now=now,
            )
            s.commit()
        print(
            f"  loaded {first + num:,} events ({time.perf_counter() - t0:.0f} s)", file=sys.stderr
        )
    seconds = time.perf_counter() - t0
    db.dispose()
    return {
        "events": total,
        "deployments": num_deployments,
        "seconds": round(seconds, 1),
        "events_per_s": round(total / seconds),
    }


def measure(
    backend: str, total: int, args: Any, decided: list[tuple[Any, Any]], tmp: Path
) -> dict[str, Any]:
    """Bulk-load ``total`` events into a fresh database, then time the fallback page and API
    (and an ingest through the API on top of that store)."""
    fresh = lc.fresh_database(backend, tmp)
    num_deployments = max(1, total // args.events_per_deployment)
    now = dt.datetime.now(dt.UTC)
    try:
        out: dict[str, Any] = {"load": bulk_load(fresh.url, decided, total, num_deployments, now)}
        tokens = lc.create_tokens(ROOT, fresh.url)
        svc = lc.start_service(ROOT, fresh.url, tmp / f"fleet-{backend}-{total}.log")
        try:
            cookie = {"Cookie": lc.page_cookie(svc.port, tokens["viewer"])}
            bearer = {"Authorization": f"Bearer {tokens['viewer']}"}
            out["page"] = {
                p: asyncio.run(lc.page_latency(svc.port, p, args.page_requests, cookie))
                for p in PAGES
            }
            out["api"] = {
                p: asyncio.run(lc.page_latency(svc.port, p, args.page_requests, bearer))
                for p in APIS
            }
            batches = lc.event_batches(
                decided,
                args.fleet_ingest_events,
                args.batch,
                num_deployments,
                "at-size",
                now - dt.timedelta(hours=1),
                dt.timedelta(hours=1),
            )
            out["ingest_at_size"] = asyncio.run(
                lc.ingest(svc.port, tokens["operator"], batches, args.batch, args.ingest_clients)
            )
        finally:
            svc.stop()
        worst = max(v["p99_ms"] for v in [*out["page"].values(), *out["api"].values()])
        out["worst_p99_ms"] = worst
        print(f"  {backend} {total:,}: worst p99 {worst} ms", file=sys.stderr)
        return out
    finally:
        fresh.drop()
