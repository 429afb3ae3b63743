"""Helpers of the service tests that start real ``turnout serve`` processes."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from turnout.dashboard.egress import EgressPolicy

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from turnout.dashboard.services import Services
    from turnout.dashboard.store.db import Database


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def role_tokens(db: Database) -> dict[str, str]:
    """One token per role, each named after its role; returns role → token."""
    from turnout.dashboard.store import tokens

    out = {}
    with db.write_session() as s:
        # The engine role came last: made last, the others keep the ids tests name them by
        # ("operator (token 2)").
        order = sorted(tokens.Role, key=lambda r: r == tokens.Role.engine)
        for role in order:
            _row, out[role.value] = tokens.create_token(
                session=s, name=role.value, role=role, actor="tests"
            )
        s.commit()
    return out


def make_tokens(url: str) -> dict[str, str]:
    """Migrate ``url`` and create one token per role; returns role → token."""
    from turnout.dashboard.store.db import Database

    db = Database(url)
    db.upgrade()
    out = role_tokens(db)
    db.dispose()
    return out


@dataclass
class LiveService:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_service(
    db_url: str,
    log: Path,
    *,
    demo: bool = False,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    port: int | None = None,
) -> LiveService:
    """``turnout serve`` in a subprocess on ``port`` (default: a free one); returns once
    /healthz answers (its log is appended to: a restart keeps the first run's)."""
    import httpx

    port = port or free_port()
    cmd = [
        sys.executable,
        "-c",
        "from turnout.oracle.cli import main; main()",
        "serve",
        "--port",
        str(port),
        "--database-url",
        db_url,
        "--demo" if demo else "--no-demo",
        *args,
    ]
    full_env = {**os.environ, "TURNOUT_LOG_LEVEL": "warning", **(env or {})}
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return LiveService(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"service did not answer within 60 s:\n{log.read_text()}")


def sign_in(client: TestClient, token: str) -> str:
    """Sign ``client`` in to the pages with ``token`` through the sign-in form (its nonce
    included); returns the CSRF field value of the session it got."""
    from turnout.dashboard.auth import COOKIE_NAME, csrf_token

    form = client.get("/login")
    found = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert found is not None, form.text
    r = client.post(
        "/login", data={"token": token, "nonce": found.group(1)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    return csrf_token(client.cookies[COOKIE_NAME])


@dataclass
class Api:
    """The API in-process (the ``api`` fixture): a TestClient, its services, a token per role."""

    client: TestClient
    services: Services
    tokens: dict[str, str]

    def h(self, role: str | None) -> dict[str, str]:
        return {} if role is None else {"Authorization": f"Bearer {self.tokens[role]}"}

    def sign_in(self, role: str) -> str:
        """Sign the client in to the pages as ``role``; returns the session's CSRF field."""
        self.client.cookies.clear()
        return sign_in(self.client, self.tokens[role])


def api_events(n: int, **over: object) -> list[dict[str, object]]:
    """``n`` ingest events (POST /api/v1/decisions items) with ``over`` applied to each."""
    at = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC).isoformat()
    return [
        {
            "event_id": uuid.uuid4().hex,
            "at": at,
            "deployment_id": f"d{i}",
            "host": "h",
            "pack": "turnout",
            "family": "qwen3",
            "runner": "v1",
            "mode": "auto",
            "reason_code": "STATIC",
            "rule_ids": ["ngram_speculation"],
            **over,
        }
        for i in range(n)
    ]


def ack(events: list[dict[str, object]], inserted: int) -> dict[str, object]:
    """The service's answer to ``POST /api/v1/decisions`` of ``events``."""
    from turnout.oracle.wire import batch_digest

    return {
        "accepted": len(events),
        "inserted": inserted,
        "batch_digest": batch_digest([str(e["event_id"]) for e in events]),
    }


#: Where the suite's webhooks may go: its receivers listen on loopback, which the service's
#: default egress policy refuses (dashboard/egress.py).
LOOPBACK_EGRESS = EgressPolicy.parse("127.0.0.0/8, ::1")
