"""The engine client's registration: where a serving engine answers and which decision it
runs, sent to ``PUT /api/v1/engines/{engine_id}`` at start-up and again as its heartbeat
every ``heartbeat_interval_s``, ended by ``DELETE`` at a clean exit.

Unlike decisions and health reports, a registration is not spooled: it says the engine lives
now, so a heartbeat that cannot be sent is simply sent again at the next beat (the service
forgets an engine whose heartbeats stop: its ``engine_ttl_s``). A refused registration (the
service's 422: another pack, an unknown stage) is logged once and not retried.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import httpx

from turnout.oracle.wire import EngineIn

log = logging.getLogger("turnout.client")

Request = Callable[..., httpx.Response]
DEFAULT_HEARTBEAT_INTERVAL_S = 15.0


class EngineRegistrations:
    """The engines one client registers (a process usually serves one)."""

    def __init__(self) -> None:
        self._engines: dict[str, EngineIn] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def add(self, engine: EngineIn) -> None:
        with self._lock:
            self._engines[engine.engine_id] = engine
            self._refused.discard(engine.engine_id)

    def remove(self, engine_id: str) -> EngineIn | None:
        with self._lock:
            return self._engines.pop(engine_id, None)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._engines)

    def __bool__(self) -> bool:
        return bool(self._engines)

    def beat(self, request: Request) -> int:
        """Send every registration once; returns how many the service took."""
        with self._lock:
            engines = [e for e in self._engines.values() if e.engine_id not in self._refused]
        taken = 0
        for engine in engines:
            try:
                resp = request(
                    "PUT",
                    f"/api/v1/engines/{engine.engine_id}",
                    json=engine.model_dump(mode="json"),
                )
            except httpx.HTTPError as err:
                log.info("engine heartbeat deferred (%s)", err)
                continue
            if resp.status_code in (200, 201):
                taken += 1
            elif resp.status_code == 422:
                with self._lock:
                    self._refused.add(engine.engine_id)
                log.error(
                    "the service refused engine %s's registration: %s",
                    engine.engine_id,
                    resp.text[:500],
                )
            else:
                log.info("engine heartbeat deferred (HTTP %d)", resp.status_code)
        return taken

    @staticmethod
    def end(request: Request, engine_id: str) -> bool:
        """Say goodbye for one engine (best effort): True when the service took it."""
        try:
            resp = request("DELETE", f"/api/v1/engines/{engine_id}")
        except httpx.HTTPError as err:
            log.info("engine %s's goodbye not sent (%s); it expires instead", engine_id, err)
            return False
        return resp.status_code in (204, 404)


__all__ = ["DEFAULT_HEARTBEAT_INTERVAL_S", "EngineRegistrations"]
