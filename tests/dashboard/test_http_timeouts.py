"""A request's headers and body must arrive within ``TURNOUT_HEADER_TIMEOUT_S`` and
``TURNOUT_BODY_TIMEOUT_S`` (dashboard/http_timeouts.py): slow clients are answered 408 and
closed, on a real ``turnout serve`` (one process and two workers), while others are served.
Before: 3,000 connections trickling header bytes stayed open for over 20 s."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from service_helpers import LiveService, start_service

TIMEOUTS = {"TURNOUT_HEADER_TIMEOUT_S": "1", "TURNOUT_BODY_TIMEOUT_S": "1"}


def _connect(service: LiveService) -> socket.socket:
    u = urlsplit(service.url)
    sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=30)
    return sock


def _read_until_closed(sock: socket.socket, within_s: float = 20) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(within_s)
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


@pytest.mark.parametrize("workers", ["1", "2"])
def test_slow_headers_and_bodies_are_cut_and_others_served(
    tmp_path: Path, live: list[LiveService], workers: str
) -> None:
    service = start_service(
        f"sqlite:///{tmp_path}/t.db", tmp_path / "log", env=TIMEOUTS, args=("--workers", workers)
    )
    live.append(service)
    # 100 connections that send part of a request line and headers, then nothing
    slow = [_connect(service) for _ in range(100)]
    for sock in slow:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    # a client that sends its headers and part of a declared body
    body = _connect(service)
    body.sendall(
        b"POST /login HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: 100\r\n\r\ntoken=tok_"
    )
    # meanwhile an ordinary request is served at once
    assert httpx.get(service.url + "/healthz", timeout=10).status_code == 200
    # a connection open with nothing sent yet is cut too (the first request's clock starts
    # when the connection opens)
    idle = _connect(service)
    for sock in [*slow, idle]:
        answer = _read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:80]
        sock.close()
    answer = _read_until_closed(body)  # the body's clock: cut as well, nothing else answered
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]
    body.close()
    # a pipelined request behind a complete one, its body trickled (before: never cut, as it
    # was parsed after the first answer, outside the clocks)
    piped = _connect(service)
    piped.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /login HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\nt"
    )
    answer = _read_until_closed(piped)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"408 Request Timeout" in answer, answer[-300:]
    piped.close()
    # keep-alive within the timeouts still works: two requests a little apart on one socket
    with httpx.Client(base_url=service.url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(0.3)
        assert client.get("/healthz").status_code == 200
    log = service.log.read_text()
    assert "Traceback" not in log, log[-3000:]
