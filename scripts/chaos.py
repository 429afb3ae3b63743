"""make chaos: kill -9 rounds against the service on each backend and against engine clients,
then acknowledged against stored. Outside ``make test`` and CI (a few minutes of both cores).

Three kinds of round, each repeated ``--rounds`` times (``--client-rounds`` for the clients):

* **ingest**: ``turnout serve`` on the backend, four writers posting batches of 200 decision
  events to ``POST /api/v1/decisions``; after a random 1 to 4 s the service gets SIGKILL while
  batches are in flight. A batch answered 200 is acknowledged: every event of it must be stored.
* **flips**: eight operators flipping the first cohort's canary with ``If-Match``; SIGKILL
  after a random 0.5 to 2 s. Every acknowledged version must be in the audit log, and the audit
  log's versions must have no gap.
* **client** (SQLite): engine clients (``OracleClient``, each its own process, its spool on
  disk) deciding and reporting as fast as they can while the service is killed and restarted
  and the clients themselves are killed. A decision is acknowledged when ``report`` returned
  (the event is in the spool); the ledger of acknowledged ids is written after that. At the end a
  fresh client on each spool flushes what is left.

The last line is one JSON object: per round kind and backend, acknowledged, stored of them,
lost, and how many requests the kill cut in flight (the window a lost acknowledgement would
fall in: a run where it is 0 proved little). The exit status is 1 when anything acknowledged
was lost, a version was acknowledged twice, or an answer was neither 200, 409 (a flip that lost
its version) nor a dropped connection.

    .venv/bin/python scripts/chaos.py [--backends sqlite,postgresql] [--rounds 10]
        [--client-rounds 14] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

PostgreSQL rounds need a server (``--pg-url``, or ``TURNOUT_TEST_PG_URL``; each run makes a
schema of its own there and drops it); ``--backends sqlite`` runs without one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, text

from turnout.dashboard.store import tokens as token_store
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.models import AuditEntry, Canary, DecisionEvent
from turnout.oracle import load_pack

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
COHORT = load_pack("turnout").cohorts[0].id  # the first rollout stage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """``turnout serve`` on one database, restartable on the same port."""

    def __init__(self, db_url: str, log: Path) -> None:
        self.db_url = db_url
        self.log = log
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "turnout.oracle.cli", "serve", "--port", str(self.port),
            "--database-url", self.db_url, "--no-demo",
        ]  # fmt: skip
        env = {**os.environ, "TURNOUT_LOG_LEVEL": "warning"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}: {self.log}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the service did not answer within 60 s: {self.log}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def database(backend: str, workdir: Path, pg_url: str) -> Iterator[str]:
    """A fresh database of ``backend``: a SQLite file, or a schema of its own on PostgreSQL
    (dropped afterwards)."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / f'chaos-{uuid.uuid4().hex[:8]}.db'}"
        return
    import psycopg

    schema = f"turnout_chaos_{uuid.uuid4().hex[:10]}"
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{pg_url}?options=-csearch_path%3D{schema}&application_name={schema}"
    finally:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND application_name = %s",
                (schema,),
            )
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def make_tokens(db_url: str) -> dict[str, str]:
    """Migrate the database and create an operator and a viewer token."""
    db = Database(db_url)
    db.upgrade()
    made = {}
    with db.write_session() as s:
        for role in (token_store.Role.operator, token_store.Role.viewer):
            _row, made[role.value] = token_store.create_token(
                session=s, name=f"chaos-{role.value}", role=role, actor="chaos"
            )
        s.commit()
    db.dispose()
    return made


def _events(n: int, run: str) -> list[dict[str, Any]]:
    now = dt.datetime.now(dt.UTC).isoformat()
    return [
        {
            "event_id": f"{run}-{uuid.uuid4().hex}",
            "at": now,
            "deployment_id": f"dep-{i % 97}",
            "pack": "turnout",
            "family": "qwen3",
            "runner": "v1",
            "mode": "auto",
            "reason_code": "STATIC",
            "rule_ids": ["ngram_speculation"],
        }
        for i in range(n)
    ]


def _kill_round(svc: Service, work: Any, num_workers: int, after_s: float) -> None:
    """Start the service, run ``work(worker, stop)`` on ``num_workers`` threads, SIGKILL the
    service after ``after_s`` seconds, then stop and join the workers."""
    svc.start()
    stop = threading.Event()
    threads = [
        threading.Thread(target=work, args=(w, stop), daemon=True) for w in range(num_workers)
    ]
    for t in threads:
        t.start()
    time.sleep(after_s)
    svc.kill()
    stop.set()
    for t in threads:
        t.join(60)


def ingest_rounds(
    svc: Service, token: str, rounds: int, rng: random.Random
) -> tuple[set[str], list[str], int]:
    """Acknowledged event ids over ``rounds`` kill -9 rounds, the answers that were neither
    200 nor a dropped connection (each one a finding), and how many batches the kill cut in
    flight (sent, never answered: the window a lost acknowledgement would fall in)."""
    acked: set[str] = set()
    odd: list[str] = []
    cut = [0]
    lock = threading.Lock()
    for r in range(rounds):

        def post(worker: int, stop: threading.Event, r: int = r) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=svc.url, timeout=30, headers=headers) as c:
                while not stop.is_set():
                    batch = _events(200, f"r{r}w{worker}")
                    try:
                        resp = c.post("/api/v1/decisions", json={"events": batch})
                    except httpx.HTTPError:
                        with lock:
                            cut[0] += 1
                        return  # the service is gone: this batch was never acknowledged
                    with lock:
                        if resp.status_code == 200:
                            acked.update(str(e["event_id"]) for e in batch)
                        else:
                            odd.append(f"ingest {resp.status_code}: {resp.text[:200]}")

        _kill_round(svc, post, 4, rng.uniform(1.0, 4.0))
    return acked, odd, cut[0]


def stored_events(db_url: str) -> set[str]:
    db = Database(db_url)
    with db.read_session() as s:
        stored = set(s.scalars(select(DecisionEvent.event_id)))
    db.dispose()
    return stored


def flip_rounds(
    svc: Service, token: str, rounds: int, rng: random.Random
) -> tuple[list[int], list[str], int]:
    """Acknowledged canary versions over ``rounds`` kill -9 rounds of concurrent flips (a
    list: two 200s for one version would be a lost update), the findings, and how many flips
    the kill cut in flight."""
    acked: list[int] = []
    odd: list[str] = []
    cut = [0]
    lock = threading.Lock()
    for _ in range(rounds):

        def flip(worker: int, stop: threading.Event) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=svc.url, timeout=30, headers=headers) as c:
                while not stop.is_set():
                    try:
                        cur = c.get(f"/api/v1/canaries/{COHORT}").json()
                        resp = c.patch(
                            f"/api/v1/canaries/{COHORT}",
                            headers={"If-Match": str(cur["version"])},
                            json={"enabled": not cur["enabled"], "reason": f"chaos w{worker}"},
                        )
                    except (httpx.HTTPError, ValueError):
                        with lock:
                            cut[0] += 1
                        return  # the service is gone mid-flip: not acknowledged
                    with lock:
                        if resp.status_code == 200:
                            acked.append(int(resp.json()["version"]))
                        elif resp.status_code != 409:  # 409: another flip won that version
                            odd.append(f"flip {resp.status_code}: {resp.text[:200]}")

        _kill_round(svc, flip, 8, rng.uniform(0.5, 2.0))
    return acked, odd, cut[0]


def audited_versions(db_url: str) -> tuple[int, list[int]]:
    """The cohort's stored version and the versions its audit entries record, sorted."""
    db = Database(db_url)
    with db.read_session() as s:
        version = int(s.scalars(select(Canary.version).where(Canary.cohort == COHORT)).one())
        audited = sorted(
            int(a.after["version"])
            for a in s.scalars(select(AuditEntry).where(AuditEntry.target == f"cohort:{COHORT}"))
            if a.after
        )
    db.dispose()
    return version, audited


# One engine client process: decides and reports until killed, writing each acknowledged
# event id (report returned: the event is in the spool on disk) to its ledger.
_CLIENT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from turnout.oracle import from_spec
    from turnout.oracle.client import OracleClient

    url, token, cache, ledger = sys.argv[1:5]
    config = from_spec({"architecture": "Qwen3ForCausalLM"})
    client = OracleClient(url, token, cache_dir=Path(cache), flush_interval_s=0.05,
                          timeout_s=2.0, batch_size=200).start()
    with open(ledger, "a") as out:
        while True:
            decision = client.decide(config, report=False)
            event_id = client.report(decision, config, deployment_id="chaos/qwen3")
            out.write(event_id + "\\n")
            out.flush()
    """
)

_FLUSH = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from turnout.oracle.client import OracleClient

    url, token, cache = sys.argv[1:4]
    client = OracleClient(url, token, cache_dir=Path(cache), timeout_s=10.0, batch_size=500)
    deadline = time.monotonic() + 120
    while client.spool.pending() and time.monotonic() < deadline:
        client.flush()
    print(client.spool.pending())
    """
)


def client_rounds(
    svc: Service, token: str, rounds: int, workdir: Path, rng: random.Random
) -> tuple[set[str], int]:
    """Acknowledged event ids of 3 engine clients over ``rounds`` rounds in which the service
    and the clients are killed at random; returns them and the events left unsent."""
    spools = [workdir / f"client-{i}" for i in range(3)]
    ledgers = [workdir / f"client-{i}.ledger" for i in range(3)]
    env = {**os.environ, "TURNOUT_LOG_LEVEL": "error"}
    for r in range(rounds):
        if svc.proc is None or svc.proc.poll() is not None:
            svc.start()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CLIENT, svc.url, token, str(spool), str(ledger)],
                env=env,
                stderr=subprocess.DEVNULL,
            )
            for spool, ledger in zip(spools, ledgers, strict=True)
        ]
        time.sleep(rng.uniform(1.5, 4.0))
        if r % 2 == 0:  # every other round the service dies too, while clients send
            svc.kill()
            time.sleep(rng.uniform(0.2, 1.0))
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
    if svc.proc is None or svc.proc.poll() is not None:
        svc.start()
    left = 0
    for spool in spools:
        out = subprocess.run(
            [sys.executable, "-c", _FLUSH, svc.url, token, str(spool)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        left += int(out.stdout.strip().splitlines()[-1])
    acked: set[str] = set()
    for ledger in ledgers:
        if ledger.exists():
            # A line cut by the kill is no acknowledged id: only whole lines count.
            acked.update(line for line in ledger.read_text().split("\n")[:-1] if line)
    return acked, left


def _row(acked: int, stored: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"acknowledged": acked, "stored": stored, "lost": acked - stored, **(extra or {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--rounds", type=int, default=10, help="kill -9 rounds per backend and kind")
    ap.add_argument("--client-rounds", type=int, default=14)
    ap.add_argument("--pg-url", default=os.environ.get("TURNOUT_TEST_PG_URL", PG_URL))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the databases, spools and logs go, kept afterwards (default: a temporary "
        "folder, removed unless something was lost or found)",
    )
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="turnout-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rounds": args.rounds, "client_rounds": args.client_rounds}
    findings: list[str] = []
    lost = 0
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with database(backend, workdir, args.pg_url) as db_url:
            made = make_tokens(db_url)
            svc = Service(db_url, workdir / f"service-{backend}.log")
            try:
                acked, odd, cut = ingest_rounds(svc, made["operator"], args.rounds, rng)
                stored = stored_events(db_url)
                row = _row(
                    len(acked),
                    len(acked & stored),
                    {"events_stored": len(stored), "batches_cut_by_kill": cut},
                )
                result[f"ingest_{backend}"] = row
                print(f"ingest on {backend}: {json.dumps(row)}", flush=True)
                versions, flip_odd, cut = flip_rounds(svc, made["operator"], args.rounds, rng)
                version, audited = audited_versions(db_url)
                gapless = audited == list(range(2, version + 1))
                twice = len(versions) - len(set(versions))  # one version acknowledged twice
                row = _row(
                    len(versions),
                    len(set(versions) & set(audited)),
                    {
                        "version": version,
                        "audit_gapless": gapless,
                        "versions_acknowledged_twice": twice,
                        "flips_cut_by_kill": cut,
                    },
                )
                result[f"flips_{backend}"] = row
                print(f"flips on {backend}: {json.dumps(row)}", flush=True)
                lost += result[f"ingest_{backend}"]["lost"] + row["lost"] + (not gapless) + twice
                findings += odd + flip_odd
                if backend == "sqlite" and args.client_rounds:
                    acked, left = client_rounds(
                        svc, made["operator"], args.client_rounds, workdir, rng
                    )
                    stored = stored_events(db_url)
                    row = _row(len(acked), len(acked & stored), {"left_in_spools": left})
                    result["client_sqlite"] = row
                    print(f"clients on {backend}: {json.dumps(row)}", flush=True)
                    lost += row["lost"]
            finally:
                svc.stop()
            if backend == "postgresql":
                with Database(db_url).engine.connect() as conn:  # the server kept up
                    conn.execute(text("SELECT 1"))
    result["findings"] = findings[:20]
    result["num_findings"] = len(findings)
    result["lost"] = lost
    print(json.dumps(result), flush=True)
    if args.workdir is None and not (lost or findings):
        shutil.rmtree(workdir, ignore_errors=True)
    elif lost or findings:
        print(f"logs, databases and spools kept in {workdir}", file=sys.stderr)
    return 1 if lost or findings else 0


if __name__ == "__main__":
    sys.exit(main())
