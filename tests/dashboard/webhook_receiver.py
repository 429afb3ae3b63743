"""A real webhook receiver for the tests: a threaded ``http.server`` on 127.0.0.1 that records
every delivery, checks its signature with ``dashboard.webhook_signing.verify``, and can answer
503 to the first N attempts or be stopped and started again on the same port."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from threaded_server import serve_in_thread

from turnout.dashboard.webhook_signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify,
)


@dataclass
class Delivery:
    delivery_id: str
    kind: str
    body: dict[str, Any]
    signed: bool  # the signature verified with the receiver's secret
    host: str = ""  # the request's Host header


@dataclass
class Receiver:
    secret: str
    fail_first: int = 0
    # how far a delivery's timestamp may be from this clock (tests of passes at chosen times
    # sign with those times)
    tolerance_s: float = 300
    # called with each accepted delivery before it is answered (a process writes it down)
    on_delivery: Callable[[Delivery], None] | None = None
    port: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    attempts: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.attempts += 1
                    failing = receiver.attempts <= receiver.fail_first
                    if not failing:
                        got = Delivery(
                            self.headers.get(DELIVERY_HEADER, ""),
                            self.headers.get(EVENT_HEADER, ""),
                            json.loads(body),
                            verify(
                                secret=receiver.secret,
                                body=body,
                                timestamp=self.headers.get(TIMESTAMP_HEADER),
                                sig=self.headers.get(SIGNATURE_HEADER),
                                now=time.time(),
                                tolerance_s=receiver.tolerance_s,
                            ),
                            self.headers.get("Host", ""),
                        )
                        receiver.deliveries.append(got)
                        if receiver.on_delivery is not None:
                            receiver.on_delivery(got)
                self.send_response(503 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        serve_in_thread(self._server)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, n: int, timeout_s: float = 60.0) -> list[Delivery]:
        """The deliveries once there are at least ``n`` (polls; raises after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.deliveries) >= n:
                    return list(self.deliveries)
            time.sleep(0.05)
        raise AssertionError(
            f"{len(self.deliveries)} deliveries, not {n}, within {timeout_s} s: {self.deliveries}"
        )


@dataclass
class StallingReceiver:
    """A receiver that takes each request and never completes its answer: ``trickle="body"``
    sends a 200 whose chunked body never ends, ``"headers"`` a status line and then header
    lines that never end, a line every 0.2 s; ``None`` sends nothing. It records the delivery
    id of each attempt (``attempts``) and calls ``on_attempt`` with the number of attempts so
    far."""

    trickle: str | None = None
    on_attempt: Callable[[int], None] | None = None
    attempts: list[str] = field(default_factory=list)
    _sock: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/hook"

    def start(self) -> StallingReceiver:
        import socket

        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _addr = self._sock.accept()
            except OSError:  # the accept timeout, or the socket closed
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            found = [
                line.split(b":", 1)[1].strip().decode()
                for line in head.split(b"\r\n")
                if line.lower().startswith(DELIVERY_HEADER.lower().encode() + b":")
            ]
            with self._lock:
                self.attempts.append(found[0] if found else "")
                n = len(self.attempts)
            if self.on_attempt is not None:
                self.on_attempt(n)
            try:
                if self.trickle == "body":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                elif self.trickle == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                more = {"body": b"1\r\nx\r\n", "headers": b"X-Pad: x\r\n"}.get(self.trickle or "")
                while not self._stop.wait(0.2):
                    if more:
                        conn.sendall(more)
            except OSError:  # the sender cut the connection
                return

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()


def main() -> None:
    """``python webhook_receiver.py PORT SECRET OUT.jsonl``: a receiver process that appends
    each delivery it accepts to OUT.jsonl (one JSON object a line, flushed before the 2xx)."""
    import sys
    from pathlib import Path

    port, secret = int(sys.argv[1]), sys.argv[2]
    with Path(sys.argv[3]).open("a") as out:

        def write(d: Delivery) -> None:
            out.write(
                json.dumps(
                    {
                        "delivery_id": d.delivery_id,
                        "kind": d.kind,
                        "body": d.body,
                        "signed": d.signed,
                    }
                )
                + "\n"
            )
            out.flush()

        Receiver(secret, port=port, on_delivery=write).start()
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
