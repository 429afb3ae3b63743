"""The closed loop end to end, as processes on loopback: ``turnout serve`` (its ramp ticker and
delivery worker in the lifespan), a webhook receiver process, CI pushing JUnit reports with
``turnout evidence push``, and six engines (tests/dashboard/fleet_engine.py) deciding through
the real engine client and reporting their health.

A ramp 10 → 50 → 100 % with short bakes steps on while V2 is healthy; the service is killed
(SIGKILL) mid-ramp, with the receiver, and started again: the ramp goes on. Then V2 crashes:
the ramp stops and rolls the stage back, the audit log and the receiver say which gate and its
figures, and every decision and health report an engine spooled is in the store. On SQLite
and on PostgreSQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_helpers import LiveService, free_port, make_tokens, start_service

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SECRET = "whsec_closed_loop_0123456789"
COHORT = "llama-mistral-dense"
ENV = {
    "TURNOUT_TICK_S": "0.2",
    "TURNOUT_WEBHOOK_POLL_S": "0.1",
    "TURNOUT_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",  # the receivers here are local
    "TURNOUT_WEBHOOK_BACKOFF_S": "0.2",
    "TURNOUT_WEBHOOK_MAX_BACKOFF_S": "1",
    "TURNOUT_WEBHOOK_MAX_ATTEMPTS": "100",
    "TURNOUT_WEBHOOK_LEASE_S": "2",
}
# The engines and the receiver keep the test's clock: under `make test-clock` (libfaketime preloaded, the wall
# clock moved) an engine on the real clock reports health windows that end a year before the
# service's "now", and no gate ever sees them.
CLOCK = {
    k: v
    for k, v in os.environ.items()
    if k in ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")
}
PASSING = b"""<testsuite name="tests/parity"><testcase classname="parity" name="greedy"/>
<testcase classname="parity" name="seeded"/></testsuite>"""


def _until(what: str, check: Callable[[], Any], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _deployments() -> list[str]:
    """Six engine ids of the stage: at 10 % at least one is on V2, at 50 % at least one on
    V1 (the share is a hash of the deployment id)."""
    from turnout.oracle import CanarySnapshot, CohortState, DeploymentConfig, decide, load_pack

    pack = load_pack("turnout")

    def runner(d: str, share: int) -> str | None:
        snap = CanarySnapshot(
            cohorts={
                c.id: CohortState(
                    enabled=c.enabled or c.id == COHORT,
                    percentage=share if c.id == COHORT else c.percentage,
                )
                for c in pack.cohorts
            },
            kill_switch=False,
        )
        config = DeploymentConfig(architecture="LlamaForCausalLM", deployment_id=d)
        return decide(config, pack=pack, canaries=snap).runner

    for first in range(100):
        ids = [f"llama-{first + i}" for i in range(6)]
        if "v2" in {runner(d, 10) for d in ids} and "v1" in {runner(d, 50) for d in ids}:
            return ids
    raise AssertionError("no six deployment ids split as wanted")


def _receiver(port: int, out: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "webhook_receiver.py"), str(port), SECRET, str(out)],
        env={"PYTHONPATH": f"{ROOT / 'src'}:{HERE}:{HERE.parent}", **CLOCK},  # signatures are dated
    )

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    _until("the receiver listens", listening, 30)
    return proc


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


class Fleet:
    def __init__(self, tmp: Path, tokens: dict[str, str]) -> None:
        self.tmp, self.tokens = tmp, tokens
        self.svc: LiveService | None = None

    def h(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def get(self, path: str) -> Any:
        assert self.svc is not None
        return httpx.get(self.svc.url + path, headers=self.h("viewer"), timeout=10).json()

    def ramp(self, ramp_id: int) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/ramps/{ramp_id}"))

    def deliveries(self) -> list[dict[str, Any]]:
        import json

        path = self.tmp / "deliveries.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _push_evidence(fleet: Fleet, family: str) -> None:
    assert fleet.svc is not None
    report = fleet.tmp / f"{family}.xml"
    report.write_bytes(PASSING)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from turnout.oracle.cli import main; main()",
            "evidence",
            "push",
            "--family",
            family,
            "--junit",
            str(report),
            "--url",
            fleet.svc.url,
        ],
        env={
            "TURNOUT_TOKEN": fleet.tokens["operator"],
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT / "src"),
        },
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_a_ramp_closes_the_loop(
    tmp_path: Path, db_url: str, live: list[LiveService], processes: list[subprocess.Popen[bytes]]
) -> None:
    url = db_url
    fleet = Fleet(tmp_path, make_tokens(url))
    port, receiver_port = free_port(), free_port()
    fleet.svc = start_service(url, tmp_path / "svc.log", env=ENV, port=port)
    live.append(fleet.svc)
    processes.append(_receiver(receiver_port, tmp_path / "deliveries.jsonl"))
    r = httpx.post(
        fleet.svc.url + "/api/v1/webhooks",
        headers=fleet.h("admin"),
        json={
            "url": f"http://127.0.0.1:{receiver_port}/hook",
            "secret": SECRET,
            "kinds": [
                "flip",
                "ramp_step",
                "gate_failure",
                "kill_switch",
                "scheduled_flip",
                "approval",
            ],
        },
    )
    assert r.status_code == 201, r.text
    for family in ("llama", "mistral"):
        _push_evidence(fleet, family)

    mode = tmp_path / "mode"
    mode.write_text("healthy")
    ids_files = []
    for d in _deployments():
        ids_files.append(tmp_path / f"{d}.ids")
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "fleet_engine.py"),
                    fleet.svc.url,
                    fleet.tokens["operator"],
                    d,
                    str(tmp_path / f"cache-{d}"),
                    str(mode),
                    str(ids_files[-1]),
                ],
                env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", **CLOCK},
            )
        )
    engines = processes[1:]

    etag = httpx.get(
        f"{fleet.svc.url}/api/v1/canaries/{COHORT}", headers=fleet.h("viewer")
    ).headers["ETag"]
    r = httpx.post(
        f"{fleet.svc.url}/api/v1/canaries/{COHORT}/ramp",
        headers={**fleet.h("operator"), "If-Match": etag},
        json={
            "steps": [
                {"percentage": 10, "bake_s": 2},
                {"percentage": 50, "bake_s": 2},
                {"percentage": 100, "bake_s": 3600},
            ],
            "gates": {"min_engines": 1},
            "on_failure": "rollback",
            "reason": "parity green; closed-loop test",
        },
    )
    assert r.status_code == 201, r.text
    ramp_id = r.json()["id"]

    _until("the ramp at 50 %", lambda: fleet.ramp(ramp_id)["step_index"] >= 1)
    fleet.svc.kill()  # SIGKILL, mid-ramp; the receiver goes down too
    processes[0].kill()
    processes[0].wait(10)
    lines = sum(len(f.read_text().splitlines()) for f in ids_files)
    _until(
        "engines spooling while the service is down",
        lambda: sum(len(f.read_text().splitlines()) for f in ids_files) >= lines + 12,
        60,
    )
    processes[0] = _receiver(receiver_port, tmp_path / "deliveries.jsonl")
    fleet.svc = start_service(url, tmp_path / "svc.log", env=ENV, port=port)
    live.append(fleet.svc)

    _until("the ramp at 100 % with V2 healthy", lambda: fleet.ramp(ramp_id)["step_index"] == 2)
    assert fleet.ramp(ramp_id)["state"] == "active"
    mode.write_text("crash")
    ramp = _until(
        "the ramp rolled back", lambda: (r := fleet.ramp(ramp_id))["state"] == "rolled_back" and r
    )
    cohort = fleet.get(f"/api/v1/canaries/{COHORT}")
    assert (cohort["enabled"], cohort["percentage"]) == (False, 100)

    audit = [
        (e["action"], e["reason"])
        for e in reversed(fleet.get(f"/api/v1/audit?target=cohort:{COHORT}"))
    ]
    assert [a for a, _r in audit] == ["ramp.start", "ramp.step", "ramp.step", "ramp.rollback"]
    why = audit[-1][1]
    assert why.startswith("gate v2_crash_rate: v2 ") and "crashes per engine (max 0.05)" in why
    assert ramp["end_reason"] == why
    failed = [g for g in ramp["last_gates"] if g["status"] == "fail"]
    assert [g["gate"] for g in failed] == ["v2_crash_rate"]

    def got_the_failure() -> list[dict[str, Any]]:
        return [d for d in fleet.deliveries() if d["kind"] == "gate_failure"]

    [failure] = _until("the receiver hears why", got_the_failure)
    assert failure["signed"] and failure["body"]["reason"] == why
    assert failure["body"]["canary"]["enabled"] is False
    steps = _until(
        "every ramp step delivered",
        lambda: (
            [d["body"]["action"] for d in fleet.deliveries() if d["kind"] == "ramp_step"]
            if len({d["delivery_id"] for d in fleet.deliveries()}) >= 4
            else None
        ),
    )
    assert sorted(set(steps)) == ["ramp.start", "ramp.step"]
    assert all(d["signed"] for d in fleet.deliveries())

    for engine in engines:
        engine.terminate()
    for engine in engines:
        assert engine.wait(30) == 0
    _assert_nothing_lost(url, ids_files)
    assert "Traceback" not in (tmp_path / "svc.log").read_text()


def _assert_nothing_lost(url: str, ids_files: list[Path]) -> None:
    """Every decision event and health report an engine spooled is in the store."""
    from sqlalchemy import select

    from turnout.dashboard.store.db import Database
    from turnout.dashboard.store.models import DecisionEvent, EngineHealth

    sent: dict[str, set[str]] = {"event": set(), "health": set()}
    for f in ids_files:
        for line in f.read_text().splitlines():
            kind, _, ident = line.partition(" ")
            sent[kind].add(ident)
    db = Database(url)
    with db.read_session() as s:
        events = set(s.scalars(select(DecisionEvent.event_id)))
        reports = set(s.scalars(select(EngineHealth.report_id)))
    db.dispose()
    assert sent["event"] and sent["health"]
    assert sent["event"] - events == set() and sent["health"] - reports == set()
