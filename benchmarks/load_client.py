"""Parts of benchmarks/service_load.py: a small HTTP/1.1 keep-alive client and the timed
phases (decide load, ingest, page latency), a ``turnout serve`` of any source tree, fresh
databases of either backend, and the inputs (real configs and their decisions)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's turnout, whatever is installed
if not __package__:  # run as a script: benchmarks.* from the root, after site-packages
    sys.path.append(str(ROOT))
PG_BASE = os.environ.get("TURNOUT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Conn:
    """One keep-alive HTTP/1.1 connection (the load generator costs little CPU)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head += f"Content-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding" and "chunked" in value:
                chunked = True
        if not chunked:
            return status, await self.reader.readexactly(length)
        data = b""
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, data
            data += chunk[:-2]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# --- a service of a source tree on a fresh database -------------------------------------------


@dataclass
class Service:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs ``tree``'s own code: its ``src/`` (turnout.*) first, or for a
    tree from before the one import root, the tree itself (bare ``oracle``)."""
    path = tree / "src" if (tree / "src" / "turnout").is_dir() else tree
    return {**os.environ, "PYTHONPATH": str(path), "TURNOUT_LOG_LEVEL": "warning"}


def _turnout(tree: Path) -> list[str]:
    package = "turnout.oracle" if (tree / "src" / "turnout").is_dir() else "oracle"
    return [sys.executable, "-c", f"from {package}.cli import main; main()"]


def create_tokens(tree: Path, url: str) -> dict[str, str]:
    """A viewer and an operator token made by ``tree``'s own CLI (which also migrates the
    database with ``tree``'s migrations), or by its store where its CLI makes only an admin
    token on the database (a tree with ``dashboard/contexts.py``: the other commands call the
    service)."""
    if (tree / "dashboard" / "contexts.py").is_file():
        return _store_tokens(tree, url)
    out = {}
    for role in ("viewer", "operator"):
        done = subprocess.run(
            [
                *_turnout(tree),
                "token",
                "create",
                "--role",
                role,
                "--name",
                f"bench-{role}",
                "--database-url",
                url,
            ],
            cwd=tree,
            env=_tree_env(tree),
            capture_output=True,
            text=True,
            check=True,
        )
        out[role] = done.stdout.strip().splitlines()[0]
    return out


def _store_tokens(
    tree: Path,
    url: str,
    names: Sequence[tuple[str, str]] = (("viewer", "viewer"), ("operator", "operator")),
) -> dict[str, str]:
    """Tokens made by ``tree``'s store on the database: ``names`` is (name, role) pairs;
    returns name → token."""
    code = (
        "import sys\n"
        "from turnout.dashboard.store import tokens\n"
        "from turnout.dashboard.store.db import Database\n"
        "db = Database(sys.argv[1])\n"
        "db.upgrade()\n"
        "with db.write_session() as s:\n"
        "    for pair in sys.argv[2:]:\n"
        "        name, role = pair.split('=')\n"
        "        _row, token = tokens.create_token(session=s, name=f'bench-{name}', "
        "role=tokens.Role(role), actor='benchmark')\n"
        "        print(name, token)\n"
        "    s.commit()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, url, *(f"{n}={r}" for n, r in names)],
        cwd=tree,
        env=_tree_env(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def start_service(tree: Path, url: str, log: Path, workers: int = 1) -> Service:
    """``turnout serve`` of ``tree``'s code; returns once /healthz answers."""
    import httpx

    port = free_port()
    cmd = [
        *_turnout(tree),
        "serve",
        "--port",
        str(port),
        "--database-url",
        url,
        "--no-demo",
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=tree,
        env=_tree_env(tree),
        stdout=open(log, "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return Service(port, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"service did not answer within 90 s:\n{log.read_text()}")


def page_cookie(port: int, token: str) -> str:
    """Sign in through the login form (with its CSRF field, when the form has one) and return
    the Cookie header the pages then take."""
    import httpx

    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, follow_redirects=False) as client:
        form = client.get("/login").text
        fields = {"token": token}
        for m in re.finditer(r'<input[^>]*type="hidden"[^>]*>', form):
            name = re.search(r'name="([^"]+)"', m.group(0))
            value = re.search(r'value="([^"]*)"', m.group(0))
            if name:
                fields[name.group(1)] = value.group(1) if value else ""
        r = client.post("/login", data=fields)
        if r.status_code not in (200, 302, 303) or not client.cookies:
            raise RuntimeError(f"sign-in failed: HTTP {r.status_code}")
        return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


@dataclass
class FreshDatabase:
    """An empty SQLite file or PostgreSQL schema; ``drop()`` removes it."""

    url: str
    schema: str | None = None

    def drop(self) -> None:
        if self.schema is None:
            for suffix in ("", "-wal", "-shm"):
                Path(self.url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
            return
        import psycopg

        with psycopg.connect(PG_BASE.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
                "pg_backend_pid() AND query ILIKE %s",
                (f"%{self.schema}%",),
            )
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def fresh_database(backend: str, tmp: Path) -> FreshDatabase:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    if backend == "sqlite":
        return FreshDatabase(f"sqlite:///{tmp / (name + '.db')}")
    import psycopg

    with psycopg.connect(PG_BASE.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return FreshDatabase(f"{PG_BASE}?options=-csearch_path%3D{name}", name)


# --- phases -----------------------------------------------------------------------------------


async def decide_load(
    port: int, token: str, bodies: list[bytes], concurrency: int, warmup_s: float, seconds: float
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    measure_from = time.perf_counter() + warmup_s
    stop_at = measure_from + seconds

    async def worker(i: int) -> None:
        nonlocal errors
        conn = Conn("127.0.0.1", port)
        n = i
        while (t0 := time.perf_counter()) < stop_at:
            status, _ = await conn.request(
                "POST", "/api/v1/decide", headers, bodies[n % len(bodies)]
            )
            n += concurrency
            errors += status != 200
            if t0 >= measure_from:
                latencies.append(time.perf_counter() - t0)
        conn.close()

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return {
        "requests": len(latencies),
        "errors": errors,
        "req_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(percentile(latencies, 0.50) * 1e3, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1e3, 2),
        "concurrency": concurrency,
    }


async def ingest(
    port: int, token: str, batches: list[bytes], batch: int, clients: int
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    queue = list(reversed(batches))
    errors: list[str] = []

    async def worker() -> None:
        conn = Conn("127.0.0.1", port)
        while queue:
            status, body = await conn.request("POST", "/api/v1/decisions", headers, queue.pop())
            if status != 200:
                errors.append(f"HTTP {status}: {body[:200]!r}")
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} ingest batches refused, first: {errors[0]}")
    return {
        "events": len(batches) * batch,
        "seconds": round(elapsed, 2),
        "events_per_s": round(len(batches) * batch / elapsed, 1),
        "clients": clients,
        "batch": batch,
    }


async def page_latency(port: int, path: str, n: int, headers: dict[str, str]) -> dict[str, Any]:
    conn = Conn("127.0.0.1", port)
    times = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        status, body = await conn.request("GET", path, headers)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {body[:300]!r}")
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - t0)
    conn.close()
    return {
        "requests": n,
        "p50_ms": round(statistics.median(times) * 1e3, 1),
        "p99_ms": round(percentile(times, 0.99) * 1e3, 1),
        "max_ms": round(max(times) * 1e3, 1),
    }


# --- inputs -----------------------------------------------------------------------------------


def decided_configs() -> list[tuple[Any, Any]]:
    """The recipes' ``vllm serve`` lines that parse, each with its decision (turnout pack)."""
    from turnout.oracle import OracleError, decide, from_command, load_pack

    pack = load_pack("turnout")
    out = []
    for line in (ROOT / "policies/reference/vllm_recipes.jsonl").read_text().splitlines():
        recipe = json.loads(line)
        try:
            # offline: the same configs on every machine, no hub look-ups before the run
            config = from_command(recipe["argv"], recipe.get("env") or {}, offline=True)
        except OracleError:
            continue
        out.append((config, decide(config, pack=pack)))
    return out


def decide_bodies(decided: list[tuple[Any, Any]]) -> list[bytes]:
    return [json.dumps({"config": c.to_spec()}).encode() for c, _d in decided]


def event_batches(
    decided: list[tuple[Any, Any]],
    num_events: int,
    batch: int,
    num_deployments: int,
    run: str,
    start: dt.datetime,
    span: dt.timedelta,
) -> list[bytes]:
    """Ingest bodies of real decisions over ``num_deployments`` deployments, in time order
    from ``start`` over ``span`` (engines report as they start)."""
    from turnout.oracle.client import event_from_decision

    step = span / max(num_events, 1)
    events = []
    for i in range(num_events):
        d = i % num_deployments
        config, decision = decided[d % len(decided)]
        e = event_from_decision(
            decision,
            config,
            pack="turnout",
            deployment_id=f"dep-{d:07d}",
            host=f"host-{d % 500:03d}",
            event_id=f"{run}-{i}",
            at=start + i * step,
        )
        e["config"] = None  # engines may omit it; keeps the bodies realistic in size
        events.append(e)
    return [
        json.dumps({"events": events[i : i + batch]}).encode() for i in range(0, len(events), batch)
    ]
