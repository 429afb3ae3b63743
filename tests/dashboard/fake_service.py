"""A misbehaving rollout-control service for the engine client's tests: a real HTTP server on a
local port whose answers the test sets (garbage bodies, wrong statuses, acknowledgements of
other batches, answers dripped a byte at a time)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from threaded_server import serve_in_thread

from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.wire import batch_digest

PACK = load_pack("turnout")
LLAMA = from_spec({"architecture": "LlamaForCausalLM"})
STAGE = decide(LLAMA, pack=PACK).stage


def canaries(enabled: Any, engaged: Any = False, **over: Any) -> dict[str, Any]:
    """A GET /api/v1/canaries body of the turnout pack: the Llama stage's ``enabled`` as given,
    every other stage at its default; ``over`` replaces top-level fields."""

    def cohort(cid: str, on: Any) -> dict[str, Any]:
        return {
            "cohort": cid,
            "label": "x",
            "position": 0,
            "enabled": on,
            "percentage": 100,
            "version": 1,
            "updated_at": "2026-11-30T00:00:00Z",
            "updated_by": "t",
        }

    return {
        "pack": "turnout",
        "pack_digest": PACK.digest,
        "kill_switch": {
            "engaged": engaged,
            "version": 1,
            "updated_at": "2026-11-30T00:00:00Z",
            "updated_by": "t",
        },
        "cohorts": [cohort(c.id, enabled if c.id == STAGE else c.enabled) for c in PACK.cohorts],
        **over,
    }


# The service's own error answers (dashboard/errors.py): the client sets events aside on
# these only, never on a proxy's page (tests/dashboard/test_client_faults.py).
_SERVICE_CODES = {413: "body_too_large", 422: "invalid_request", 401: "bad_token"}


def _service_error(code: str, message: str) -> bytes:
    return json.dumps({"detail": {"code": code, "message": message}}).encode()


class FakeService(ThreadingHTTPServer):
    """Answers GET /api/v1/canaries with ``canaries``, POST /api/v1/health as the service does
    (storing into ``health``), and POST /api/v1/decisions per event:
        the service's acknowledgement when every event is valid, 422 otherwise;
        ``ingest_status`` (with a JSON error body) or ``ingest_answer`` (status, body, type)
        instead when set. ``drip_s``: the first ``drip_bytes`` of every answer are sent a byte at
        a time, ``drip_s`` apart; ``cut_off`` counts the answers the client hung up on."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.canaries: tuple[int, bytes] = (200, json.dumps(canaries(True)).encode())
        self.ingest_status: int | None = None
        self.ingest_answer: tuple[int, bytes, str] | None = None
        self.stored: dict[str, dict[str, Any]] = {}
        self.health: dict[str, dict[str, Any]] = {}
        self.drip_s: float | None = None
        self.drip_bytes = 80
        self.cut_off = 0
        self.answered = threading.Semaphore(0)  # released after each answer, cut or whole

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeService
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        data = head + body
        try:
            sent = 0
            while self.server.drip_s is not None and sent < min(self.server.drip_bytes, len(data)):
                self.wfile.write(data[sent : sent + 1])
                self.wfile.flush()
                sent += 1
                time.sleep(self.server.drip_s or 0)
            data = data[sent:]
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.server.cut_off += 1
        finally:
            self.close_connection = True
            self.server.answered.release()

    def do_GET(self) -> None:
        self._answer(*self.server.canaries)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.ingest_answer is not None:
            return self._answer(*self.server.ingest_answer)
        if self.path == "/api/v1/health":
            return self._health(body["reports"])
        events = body["events"]
        if self.server.ingest_status is not None:
            status = self.server.ingest_status
            code = _SERVICE_CODES.get(status, "internal_error")
            return self._answer(status, _service_error(code, "as the test set it"))
        if any(not isinstance(e.get("deployment_id"), str) or "at" not in e for e in events):
            return self._answer(422, _service_error("invalid_request", "bad event"))
        for e in events:
            self.server.stored[e["event_id"]] = e
        ack = {
            "accepted": len(events),
            "inserted": len(events),
            "batch_digest": batch_digest([e["event_id"] for e in events]),
        }
        self._answer(200, json.dumps(ack).encode())

    def _health(self, reports: list[dict[str, Any]]) -> None:
        """Stores every report but those of stage ``refuse-me``, which it refuses alone."""
        refused = [
            {
                "index": i,
                "report_id": r["report_id"],
                "detail": {"code": "unknown_stage", "message": "bad"},
            }
            for i, r in enumerate(reports)
            if r.get("stage") == "refuse-me"
        ]
        for r in reports:
            if r.get("stage") != "refuse-me":
                self.server.health[r["report_id"]] = r
        ack = {
            "accepted": len(reports) - len(refused),
            "inserted": 0,
            "rejected": refused,
            "batch_digest": batch_digest([r["report_id"] for r in reports]),
        }
        self._answer(200, json.dumps(ack).encode())


@contextmanager
def serving() -> Iterator[FakeService]:
    server = FakeService()
    serve_in_thread(server)
    try:
        yield server
    finally:
        server.drip_s = None
        server.shutdown()
        server.server_close()


def wait_for(cond: Any, timeout_s: float = 10.0) -> bool:
    """Poll ``cond`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False
