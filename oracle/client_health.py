"""The engine client's health reports: what a running engine measured over a window, on its
way to ``POST /api/v1/health`` with the discipline of decision events.

A source (a callable: turnout's engine hands ``engine.health.HealthRecorder.cut``) gives the
fields of one report (``oracle.wire.HealthReportIn`` less ``report_id``, ``host`` and
``pack``, which the client adds) or None when it has nothing to say. The client's background
thread asks every watched source once per ``health_interval_s`` and once more when a source is
unwatched or the client closes. Each report is validated, then appended and fsynced to its own
spool (``cache_dir/spool-health/``) before :meth:`HealthReports.report` returns, sent in
batches, idempotent by report id, and deleted from the spool only once the service's
acknowledgement names the batch; the reports the service refuses (each alone: it names them)
are set aside in ``rejected-*.jsonl``, never dropped.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from turnout.oracle.client_http import RefusalLog, health_rejects, whole_batch_refused
from turnout.oracle.client_spool import SendResult, Spool
from turnout.oracle.wire import HealthReportIn

log = logging.getLogger("turnout.client")

HealthSource = Callable[[], Mapping[str, Any] | None]
Request = Callable[..., httpx.Response]


class HealthReports:
    """The health spool of one client, its sources and its sender."""

    def __init__(self, directory: Path, *, host: str, pack: str) -> None:
        self.spool = Spool(directory)
        self.host = host
        self.pack = pack
        self._sources: list[HealthSource] = []
        self._lock = threading.Lock()
        self._refused = RefusalLog()

    def report(self, fields: Mapping[str, Any]) -> str:
        """Validate one report (``HealthReportIn`` fields; ``report_id``, ``host`` and ``pack``
        filled in when absent) and append it to the spool, durable on return; returns its id.

        Raises:
            ValueError: the fields are not a report (pydantic's ValidationError).
            OSError: the spool cannot be written.
        """
        report = HealthReportIn.model_validate(
            {"report_id": uuid.uuid4().hex, "host": self.host, "pack": self.pack, **fields}
        )
        self.spool.append(report.model_dump(mode="json"))
        return report.report_id

    def watch(self, source: HealthSource) -> None:
        with self._lock:
            self._sources.append(source)

    def unwatch(self, source: HealthSource) -> int:
        """Stop asking ``source``, after one last report from it; returns the reports spooled."""
        with self._lock:
            if source not in self._sources:
                return 0
            self._sources.remove(source)
        return self._take(source)

    def collect(self) -> int:
        """Ask every watched source for its report now; returns how many were spooled."""
        with self._lock:
            sources = list(self._sources)
        return sum(self._take(s) for s in sources)

    def _take(self, source: HealthSource) -> int:
        fields = source()
        if fields is None:
            return 0
        try:
            self.report(fields)
        except ValueError as err:  # a source's bug; nothing a resend would mend
            log.error("health report not spooled: %s", err)
            return 0
        return 1

    def send(self, request: Request, batch: list[dict[str, Any]]) -> SendResult:
        """Post one batch; what the spool does with it next (``client_spool.SendResult``)."""
        ids = [str(r.get("report_id", "")) for r in batch]
        try:
            resp = request("POST", "/api/v1/health", json={"reports": batch})
        except httpx.HTTPError as err:
            log.info("health report deferred (%s); %d reports stay spooled", err, len(batch))
            return "retry"
        if resp.status_code == 200:
            refused = health_rejects(resp, ids)
            return "retry" if refused is None else (refused or "ok")
        if resp.status_code in (413, 422):  # the batch as a whole: split it
            return whole_batch_refused("health reports", resp, len(batch))
        if resp.status_code in (401, 403):
            self._refused("health report", resp, len(batch))
        else:
            log.info("health report deferred (HTTP %d)", resp.status_code)
        return "retry"
