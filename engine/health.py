"""The engine's runtime health, measured per request and handed to the oracle client per window.

:class:`HealthRecorder` times each request the engine accepted: TTFT from when it was queued to
when its first output token came back from the runner, TPOT from the first token to the last
over the tokens after the first; it counts finished requests, the ones that failed in the engine
(``finish_reason == "error"``, or aborted because a step raised: requests refused before they
were queued are the caller's, not the engine's), and output tokens over the seconds the engine
spent stepping. :meth:`HealthRecorder.cut` closes a window and gives its report (the fields of
``oracle.wire.HealthReportIn``), which ``oracle.client.OracleClient.watch_health`` asks for
every ``health_interval_s`` and once more at the end. Latency percentiles are nearest-rank over
the window's requests. Stdlib only: no torch, no pydantic (the client validates the report).

:class:`RunMarker` tells a crash from a clean end: a file per deployment in the cache directory,
held under an exclusive ``flock`` while the engine runs and marked ``closed`` when it ends
cleanly. An engine that finds it unlocked but still marked ``running`` follows a run that died
(a crash, a kill, a lost machine) and reports one crash in its first window.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("turnout.engine")

MAX_WINDOW = dt.timedelta(days=1)  # the service's bound on one report's window


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0 < q <= 1) of a non-empty sorted list."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


class HealthRecorder:
    """Per-request timings of one engine (one deployment, one runner), cut into windows.

    Thread-safe: the engine's thread records, the client's background thread cuts.

    Args:
        deployment_id, runner, family, stage: what the reports are about (the decision's).
        num_crashes: crashes to report in the first window (:attr:`RunMarker.crashed`).
        clock: monotonic seconds (request timings); wall: the aware UTC time (windows).
    """

    def __init__(
        self,
        *,
        deployment_id: str,
        runner: str,
        family: str,
        stage: str | None,
        num_crashes: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.about = {
            "deployment_id": deployment_id,
            "runner": runner,
            "family": family,
            "stage": stage,
        }
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._window_start = wall()
        self._num_crashes = num_crashes
        self._queued: dict[str, float] = {}  # req id → when queued
        self._first: dict[str, float] = {}  # req id → when its first token came
        self._seen: dict[str, int] = {}  # req id → output tokens counted so far
        self._reset()
        self._busy_since: float | None = None

    def _reset(self) -> None:
        self._ttft_ms: list[float] = []
        self._tpot_ms: list[float] = []
        self._num_requests = self._num_errors = self._num_tokens = 0
        self._busy_s = 0.0

    # -- recording (the engine's thread) -------------------------------------------------
    def queued(self, req_id: str) -> None:
        """A request was accepted and queued."""
        with self._lock:
            self._queued[req_id] = self._clock()
            self._seen[req_id] = 0

    def observe(self, progress: Iterable[tuple[str, int]]) -> None:
        """After a step: each unfinished request's id and its output tokens so far."""
        now = self._clock()
        with self._lock:
            for req_id, num_tokens in progress:
                seen = self._seen.get(req_id)
                if seen is None or num_tokens == seen:
                    continue
                if seen == 0:
                    self._first[req_id] = now
                    self._ttft_ms.append((now - self._queued[req_id]) * 1e3)
                self._num_tokens += num_tokens - seen
                self._seen[req_id] = num_tokens

    def finished(self, req_id: str, *, failed: bool) -> None:
        """A request finished (``failed``: in the engine); call after :meth:`observe`."""
        now = self._clock()
        with self._lock:
            if self._queued.pop(req_id, None) is None:
                return
            first = self._first.pop(req_id, None)
            num_tokens = self._seen.pop(req_id, 0)
            self._num_requests += 1
            self._num_errors += int(failed)
            if first is not None and num_tokens >= 2:
                self._tpot_ms.append((now - first) * 1e3 / (num_tokens - 1))

    def failed_all(self) -> None:
        """A step raised: every queued request is aborted, each a failure of the engine."""
        with self._lock:
            queued = list(self._queued)
        for req_id in queued:
            self.finished(req_id, failed=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around the engine's stepping: the seconds tokens/s is measured over."""
        with self._lock:
            self._busy_since = self._clock()
        try:
            yield
        finally:
            with self._lock:
                if self._busy_since is not None:
                    self._busy_s += self._clock() - self._busy_since
                self._busy_since = None

    # -- reporting (the client's thread) -------------------------------------------------
    def cut(self) -> dict[str, Any]:
        """Close the window now and return its report (``HealthReportIn`` fields without
        ``report_id``, ``host``, ``pack``); the next window starts here."""
        with self._lock:
            end = max(self._wall(), self._window_start + dt.timedelta(microseconds=1))
            busy_s = self._busy_s
            if self._busy_since is not None:  # cut while stepping: split the busy time
                now = self._clock()
                busy_s += now - self._busy_since
                self._busy_since = now
            # A window is at most a day (the service's bound): one cut later than that keeps
            # its last day, and its busy time no more than the day (tokens over their rate
            # must fit in the window).
            busy_s = min(busy_s, MAX_WINDOW.total_seconds())
            report = {
                **self.about,
                "window_start": max(self._window_start, end - MAX_WINDOW),
                "window_end": end,
                "num_requests": self._num_requests,
                "num_errors": self._num_errors,
                "num_crashes": self._num_crashes,
                **_quantiles("ttft", self._ttft_ms),
                **_quantiles("tpot", self._tpot_ms),
                "num_output_tokens": self._num_tokens,
                "output_tokens_per_s": self._num_tokens / busy_s if busy_s > 0 else 0.0,
            }
            self._window_start, self._num_crashes = end, 0
            self._reset()
        return report


def _quantiles(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_p50_ms": None, f"{name}_p99_ms": None}
    values = sorted(values)
    return {f"{name}_p50_ms": percentile(values, 0.50), f"{name}_p99_ms": percentile(values, 0.99)}


class RunMarker:
    """The run of one deployment on this host, held for as long as the engine runs.

    ``crashed``: the previous run of the deployment did not end cleanly; ``crashed_runner``:
    the runner that run used (``"v1"``, ``"v2"``; None when its marker does not say), to
    which the crash belongs whatever the next run decides. ``held`` is False when another live
    engine of the same deployment holds the marker (no crash is told then).
    """

    def __init__(
        self, fd: int | None, crashed: bool, path: Path, crashed_runner: str | None = None
    ) -> None:
        self._fd = fd
        self.crashed = crashed
        self.crashed_runner = crashed_runner
        self.path = path

    @property
    def held(self) -> bool:
        return self._fd is not None

    @classmethod
    def acquire(cls, directory: Path, deployment_id: str, runner: str | None = None) -> RunMarker:
        """Take the marker of ``deployment_id`` under ``directory`` (created if missing), for
        a run on ``runner`` (written down: a crash of this run is that runner's).

        Raises:
            OSError: the directory or the file cannot be written.
        """
        directory.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(deployment_id.encode()).hexdigest()[:16]
        path = directory / f"{name}.run"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return cls(None, False, path)
        # "running <pid> <runner or -> <deployment id>" (before runners were written down:
        # "running <pid> <deployment id>", whose runner is not known).
        words = os.pread(fd, 64, 0).decode("utf-8", "replace").split(" ", 3)
        crashed = words[0] == "running"
        crashed_runner = (
            words[2] if crashed and len(words) == 4 and words[2] in ("v1", "v2") else None
        )
        _mark(fd, f"running {os.getpid()} {runner or '-'} {deployment_id[:200]}\n")
        if crashed:
            logger.warning(
                "the previous run of deployment %s did not end cleanly: reporting a crash%s",
                deployment_id,
                f" of {crashed_runner.upper()}" if crashed_runner else "",
            )
        return cls(fd, crashed, path, crashed_runner)

    def release(self) -> None:
        """The run ends cleanly: mark the file ``closed`` and let go of it (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            _mark(fd, "closed\n")
        finally:
            os.close(fd)


def _mark(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    os.fsync(fd)


__all__ = ["HealthRecorder", "RunMarker", "percentile"]
