"""A real Prometheus (Debian's ``prometheus``) on loopback for the fleet tests, with a config
the test writes, and a tiny exporter whose values the test sets (prometheus_client's own
HTTP server)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from service_helpers import free_port
from threaded_server import serve_in_thread

PROMETHEUS = shutil.which("prometheus")


def skip_under_a_shifted_clock() -> None:
    """Skip the test under ``make test-clock``. Prometheus and Alertmanager are Go programs:
    Go reads the kernel's clock through the vDSO, never through libc, so libfaketime cannot
    move them. The service would query a Prometheus 400 days behind it (no data at that
    time) and receive alerts dated a year before its "now"."""
    if os.environ.get("FAKETIME"):
        pytest.skip("Prometheus and Alertmanager (Go) keep the real clock under libfaketime")


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def query(self, promql: str) -> list[dict[str, object]]:
        body = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=5).json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        assert isinstance(result, list)
        return result

    def wait_for(self, promql: str, timeout_s: float = 60) -> list[dict[str, object]]:
        """The query's result once it has one (Prometheus scrapes every second here)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.1)
        raise AssertionError(f"{promql!r} has no data after {timeout_s} s:\n{self.log.read_text()}")


def serve_text_format(registry: CollectorRegistry, port: int) -> ThreadingHTTPServer:
    """``registry`` at ``http://127.0.0.1:port/metrics`` in the classic text format, as
    ``turnout engine serve`` answers. (prometheus_client 0.26's own server answers
    Prometheus' Accept header with OpenMetrics, whose samples it writes with the colons of
    vLLM's names escaped: ``vllm_time_to_first_token_seconds_bucket``.)"""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    serve_in_thread(server)
    return server


def start_prometheus(
    tmp: Path, config_yaml: str, *, extra: tuple[str, ...] = ()
) -> PrometheusServer:
    """Prometheus on a free loopback port with ``config_yaml``; returns once it is ready.
    Skips the test where the Debian package is not installed (``make test`` installs it) and
    under a shifted clock (:func:`skip_under_a_shifted_clock`)."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    skip_under_a_shifted_clock()
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(config_yaml)
    log = tmp / "prometheus.log"
    cmd = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                return PrometheusServer(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"prometheus was not ready in 60 s:\n{log.read_text()}")
