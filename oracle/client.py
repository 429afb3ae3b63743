"""The engine's client of the rollout-control service (httpx only; no fastapi/sqlalchemy).

An engine asks once at start-up which runner to use. The client

* decides locally with the oracle against the service's canary snapshot, fetched in the
  background by ETag and kept on disk as the last-known-good copy — only a snapshot of the
  engine's own pack is used or kept (``oracle/client_snapshot.py``);
* bounds every request by ``timeout_s`` in all, not per read (``oracle/client_http.py``);
* never blocks start-up for long: the first ``decide()`` waits at most ``startup_wait_s`` for
  the first fetch, then falls back to the copy on disk, then to the pack's defaults from
  ``rollout.yaml`` (``canaries=None``) — with the service down it decides within 100 ms;
* reports each decision as an event that is appended (and fsynced) to a spool on disk before
  ``report()`` returns, and sent in background batches (``POST /api/v1/decisions``, idempotent
  by event id); a spool segment is deleted only after the service acknowledged it (its JSON
  answer naming this batch: a ``200`` from a proxy is no acknowledgement), so an event is
  never lost between the engine and the store, whoever crashes;
* reports the running engine's health the same way (``POST /api/v1/health``,
  ``oracle/client_health.py``): a source it watches gives one report per
  ``health_interval_s`` and a last one at the end.

Usage (``from turnout.oracle import from_command``)::

    with OracleClient("http://127.0.0.1:8000", token, cache_dir=Path("~/.cache/turnout")) as c:
        decision = c.decide(from_command(argv, env), deployment_id="prod-7")
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import httpx

from turnout.oracle import (
    CanarySnapshot,
    Decision,
    DeploymentConfig,
    bounded_json,
    decide,
    load_pack,
)
from turnout.oracle.client_engines import DEFAULT_HEARTBEAT_INTERVAL_S, EngineRegistrations
from turnout.oracle.client_health import HealthReports, HealthSource
from turnout.oracle.client_http import (
    RefusalLog,
    acknowledged,
    request_within,
    whole_batch_refused,
)
from turnout.oracle.client_snapshot import (
    canonical_body,
    checked_snapshot,
    kill_switch_of_revision,
    load_last_known_good,
    save_last_known_good,
)
from turnout.oracle.client_spool import SendResult, Spool
from turnout.oracle.wire import EngineIn, LaunchIn, SnapshotIn, decision_event

log = logging.getLogger("turnout.client")

SnapshotSource = Literal["service", "disk", "defaults"]


def event_from_decision(
    decision: Decision,
    config: DeploymentConfig,
    *,
    pack: str,
    deployment_id: str,
    host: str = "",
    at: datetime | None = None,
    event_id: str | None = None,
    demo: bool = False,
    launch: LaunchIn | None = None,
) -> dict[str, Any]:
    """The ingest event (``POST /api/v1/decisions`` item, ``oracle.wire.EventIn``) for one
    decision, as JSON data (``launch`` only when given)."""
    return decision_event(
        decision,
        config,
        pack=pack,
        deployment_id=deployment_id,
        host=host,
        at=at,
        event_id=event_id,
        demo=demo,
        launch=launch,
    ).to_json()


def snapshot_from_json(body: Any) -> CanarySnapshot:
    """The oracle's CanarySnapshot from a ``GET /api/v1/canaries`` body
    (``oracle.wire.SnapshotIn``).

    Raises ValueError for anything else (types are checked, not coerced: ``"false"`` is not
    a boolean, ``"50"`` not a percentage).
    """
    return SnapshotIn.parse(body).to_snapshot()


class OracleClient:
    """Embedded decisions with the service's canaries; background snapshot and reports."""

    def __init__(
        self,
        url: str | None,
        token: str | None = None,
        *,
        cache_dir: Path,
        pack: str = "turnout",
        host: str | None = None,
        timeout_s: float = 0.5,
        startup_wait_s: float = 0.05,
        refresh_interval_s: float = 30.0,
        flush_interval_s: float = 1.0,
        health_interval_s: float = 60.0,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        batch_size: int = 500,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.pack_name = pack
        self.pack = load_pack(pack)  # compiled once, before any deadline starts
        # What events, health reports, registrations and the last-known-good file name say:
        # the pack's own name, also when it was given as a folder (a path is no name).
        self.wire_pack = self.pack.name
        self.host = host if host is not None else socket.gethostname()
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.startup_wait_s = startup_wait_s
        self.timeout_s = timeout_s
        self.refresh_interval_s = refresh_interval_s
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.health_interval_s = health_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.engines = EngineRegistrations()
        self.spool = Spool(self.cache_dir / "spool")
        self.health = HealthReports(
            self.cache_dir / "spool-health", host=self.host, pack=self.wire_pack
        )
        # No keep-alive: each request opens the connection its deadline can cut
        # (oracle/client_http.py); at about one request a second that costs nothing.
        self._http = (
            None
            if url is None
            else httpx.Client(
                base_url=url.rstrip("/"),
                timeout=httpx.Timeout(timeout_s),
                transport=transport,
                limits=httpx.Limits(max_keepalive_connections=0),
                headers={"Authorization": f"Bearer {token}"} if token else {},
            )
        )
        self._etag: str | None = None
        self._snapshot: CanarySnapshot | None = None
        # The kill switch of a snapshot of another revision of this pack: honoured although
        # the snapshot is not (engaging it only sends deployments to V1, which every revision
        # can express), never saved as the last-known-good copy.
        self._foreign_kill_switch = False
        self._refused = RefusalLog()  # a token the service refuses: said once, with why
        self.snapshot_source: SnapshotSource = "defaults"
        self._first_fetch = threading.Event()
        self._wake = threading.Event()
        self._beat_now = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._load_last_known_good()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> OracleClient:
        """Start the background thread (snapshot refresh, batched reports)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="turnout-client", daemon=True)
            self._thread.start()
        return self

    def close(self, flush_timeout_s: float = 2.0) -> None:
        """Stop the thread after a last health report of every watched source and one last
        send (what is unsent stays in the spools for next time), and end the registration of
        every engine still registered."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=flush_timeout_s + 1.0)
            self._thread = None
        elif self._http is not None:
            self._safely(self.health.collect)  # spooled: the next client sends it
        for spool in (self.spool, self.health.spool):
            self._safely(spool.close)
        for engine_id in self.engines.ids():  # an engine still registered ends with its client
            self.end_engine(engine_id)
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> OracleClient:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def service_configured(self) -> bool:
        """A service URL was given: snapshots are fetched and decisions reported."""
        return self._http is not None

    # -- deciding --------------------------------------------------------------------------
    def snapshot(self) -> CanarySnapshot | None:
        """The snapshot ``decide`` uses (None: the pack's defaults). The first call waits up
        to ``startup_wait_s`` for the background fetch."""
        if self._thread is not None and not self._first_fetch.is_set():
            self._first_fetch.wait(self.startup_wait_s)
        if self._foreign_kill_switch:
            return dataclasses.replace(self._snapshot or CanarySnapshot(), kill_switch=True)
        return self._snapshot

    def decide(
        self, config: DeploymentConfig, *, deployment_id: str | None = None, report: bool = True
    ) -> Decision:
        """Decide locally (never raises for an unknown architecture; no network wait beyond
        ``startup_wait_s``) and, when ``report`` and a service URL is set, spool the event for
        the service. A spool that cannot be written (a full disk) is logged as an error and the
        decision still returned, as is one no event can carry (a deployment id over 256
        characters): :meth:`report` raises instead, for callers that must know."""
        decision = decide(config, pack=self.pack, canaries=self.snapshot())
        if report and self._http is not None:  # no service configured: nothing to report to
            try:
                self.report(
                    decision,
                    config,
                    deployment_id=deployment_id or config.deployment_id or self.host,
                )
            except OSError as err:  # a full disk must not stop the engine from starting
                log.error(
                    "decision (runner %s, %s) not reported: cannot write the spool in %s (%s)",
                    decision.runner,
                    decision.reason_code,
                    self.spool.directory,
                    err,
                )
            except ValueError as err:  # no event can say it (a deployment id too long)
                log.error(
                    "decision (runner %s, %s) not reported: it is no event (%s)",
                    decision.runner,
                    decision.reason_code,
                    err,
                )
        return decision

    def report(
        self,
        decision: Decision,
        config: DeploymentConfig,
        *,
        deployment_id: str,
        launch: LaunchIn | None = None,
        event_id: str | None = None,
    ) -> str:
        """Append the decision's event to the on-disk spool (durable on return); returns the
        event id. The background thread sends it. ``launch``: how ``turnout launch`` started
        vLLM with it; ``event_id``: the id to use (default: a new random one)."""
        event = event_from_decision(
            decision,
            config,
            pack=self.wire_pack,
            deployment_id=deployment_id,
            host=self.host,
            event_id=event_id,
            launch=launch,
        )
        self.spool.append(event)
        self._wake.set()
        return str(event["event_id"])

    # -- runtime health ---------------------------------------------------------------------
    def report_health(self, fields: Mapping[str, Any]) -> str | None:
        """Spool one health report (``oracle.wire.HealthReportIn`` fields; ``report_id``,
        ``host`` and ``pack`` are filled in), durable on return; its id, or None without a
        service URL (nothing to report to). Raises ValueError for fields that are not a
        report, OSError for a spool that cannot be written."""
        if self._http is None:
            return None
        report_id = self.health.report(fields)
        self._wake.set()
        return report_id

    def watch_health(self, source: HealthSource) -> None:
        """Ask ``source`` for a report every ``health_interval_s`` (in the background
        thread), and once more at :meth:`unwatch_health` or :meth:`close`."""
        if self._http is not None:
            self.health.watch(source)

    def unwatch_health(self, source: HealthSource) -> None:
        """Stop asking ``source``, after spooling its last report (a clean engine's end)."""
        if self.health.unwatch(source):
            self._wake.set()

    def register_engine(self, engine: EngineIn) -> None:
        """Register a serving engine with the service now (in the background thread) and
        again every ``heartbeat_interval_s`` until :meth:`end_engine` or :meth:`close`
        (``oracle/client_engines.py``). Nothing happens without a service URL."""
        if self._http is None:
            return
        self.engines.add(engine)
        self._beat_now = True
        self._wake.set()

    def end_engine(self, engine_id: str) -> bool:
        """Stop the heartbeat and say goodbye (``DELETE``, within ``timeout_s``): the engine
        leaves the service's targets at once. True when the service took it."""
        if self.engines.remove(engine_id) is None or self._http is None:
            return False
        return EngineRegistrations.end(self._request, engine_id)

    # -- background work -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._safely(self.refresh)
        finally:
            self._first_fetch.set()
        now = time.monotonic()
        next_refresh, next_health = now + self.refresh_interval_s, now + self.health_interval_s
        next_beat = now
        while not self._stop.is_set():
            if self._beat_now or time.monotonic() >= next_beat:
                self._beat_now = False
                if self.engines:
                    self._safely(lambda: self.engines.beat(self._request))
                next_beat = time.monotonic() + self.heartbeat_interval_s
            self._safely(self.flush)
            soonest = min(next_refresh, next_health, next_beat) - time.monotonic()
            self._wake.wait(max(0.0, min(self.flush_interval_s, soonest)))
            self._wake.clear()
            now = time.monotonic()
            if now >= next_refresh:
                self._safely(self.refresh)
                next_refresh = now + self.refresh_interval_s
            if now >= next_health:
                self._safely(self.health.collect)
                next_health = now + self.health_interval_s
        self._safely(self.health.collect)
        self._safely(self.flush)

    @staticmethod
    def _safely(step: Callable[[], object]) -> None:
        """One background step; whatever goes wrong, the thread lives on to try again (a dead
        thread would leave every later event unsent until the engine restarts)."""
        try:
            step()
        except Exception:
            log.exception(
                "turnout client background step %s failed; retrying later",
                getattr(step, "__name__", step),
            )

    def refresh(self) -> SnapshotSource:
        """Fetch the snapshot (conditional on the ETag, within ``timeout_s`` in all); on any
        failure, and for a body that is not a snapshot of this engine's pack, keep what we
        have."""
        if self._http is None:
            return self.snapshot_source
        headers = {"If-None-Match": self._etag} if self._etag else {}
        try:
            resp = self._request("GET", "/api/v1/canaries", headers=headers)
        except httpx.HTTPError as err:
            log.warning(
                "canary snapshot fetch failed (%s); using the %s copy", err, self.snapshot_source
            )
            return self.snapshot_source
        if resp.status_code == 304 and "If-None-Match" in headers:
            self.snapshot_source = "service"
            return "service"
        if resp.status_code != 200:
            log.warning(
                "canary snapshot fetch: HTTP %d; using the %s copy",
                resp.status_code,
                self.snapshot_source,
            )
            return self.snapshot_source
        body: Any = None
        try:
            body = bounded_json.loads(resp.text)
            snapshot = checked_snapshot(body, self.pack, self.pack_name)
        except ValueError as err:  # garbage, or another pack's snapshot
            self._foreign_kill_switch = kill_switch_of_revision(body, self.pack, self.pack_name)
            log.warning(
                "canary snapshot fetch: %s; using the %s copy%s",
                err,
                self.snapshot_source,
                " with the service's kill switch, which is engaged"
                if self._foreign_kill_switch
                else "",
            )
            return self.snapshot_source
        self._foreign_kill_switch = False
        self._snapshot = snapshot
        self._etag = resp.headers.get("ETag")
        self.snapshot_source = "service"
        save_last_known_good(self._lkg_path, canonical_body(body), self._etag)
        return "service"

    def flush(self) -> int:
        """Send every spooled event and health report now; returns how many the service
        acknowledged."""
        if self._http is None:
            return 0
        sent = self.spool.drain(self._send, self.batch_size)
        return sent + self.health.spool.drain(
            lambda batch: self.health.send(self._request, batch), self.batch_size
        )

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        assert self._http is not None
        return request_within(self._http, method, url, deadline_s=self.timeout_s, **kwargs)

    def _send(self, batch: list[dict[str, Any]]) -> SendResult:
        ids = [str(e.get("event_id", "")) for e in batch]
        try:
            resp = self._request("POST", "/api/v1/decisions", json={"events": batch})
        except httpx.HTTPError as err:
            log.info("decision report deferred (%s); %d events stay spooled", err, len(batch))
            return "retry"
        if resp.status_code == 200:
            return "ok" if acknowledged(resp, ids) else "retry"
        if resp.status_code in (413, 422):
            return whole_batch_refused("events", resp, len(batch))
        if resp.status_code in (401, 403):
            self._refused("decision report", resp, len(batch))
        else:
            log.info("decision report deferred (HTTP %d)", resp.status_code)
        return "retry"

    # -- last-known-good -------------------------------------------------------------------
    @property
    def _lkg_path(self) -> Path:
        return self.cache_dir / f"snapshot-{self.wire_pack}.json"

    def _load_last_known_good(self) -> None:
        kept = load_last_known_good(self._lkg_path, self.pack, self.pack_name)
        if kept is not None:
            self._snapshot, self._etag = kept
            self.snapshot_source = "disk"
