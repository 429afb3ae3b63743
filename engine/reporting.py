"""How turnout's engine reports to the rollout-control service: its start-up decision and its
runtime health, through ``oracle.client.OracleClient``.

``LLM(..., oracle_client=client)`` uses the given client (the caller closes it); otherwise the
environment names the service (read from the ``environ`` the engine was given, by default the
process's):

| variable | meaning |
|---|---|
| ``TURNOUT_URL`` | the service, e.g. ``http://rollout:8000``; unset: the engine decides alone and reports nothing |
| ``TURNOUT_TOKEN`` | an operator token (reports are writes) |
| ``TURNOUT_CACHE_DIR`` | the client's last-known-good snapshot, spools and run markers (default ``$XDG_CACHE_HOME/turnout``, else ``~/.cache/turnout``) |
| ``TURNOUT_DEPLOYMENT_ID`` | the deployment's id (the canary split is sticky by it; default: the host name) |
| ``TURNOUT_HEALTH_INTERVAL_S`` | seconds per health report (default 60) |

With a client, the decision comes from ``OracleClient.decide`` (the service's canaries, the
event spooled for it), a :class:`~engine.health.RunMarker` is held for the run (a start after a
run that died reports a crash), and an :class:`~engine.health.HealthRecorder` is watched by the
client; :meth:`Reporting.end` (``LLM.close``, or the interpreter's exit) hands the last report
over and marks the run closed.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnout.engine.errors import EngineConfigError
from turnout.engine.health import HealthRecorder, RunMarker

logger = logging.getLogger("turnout.engine")

DEFAULT_HEALTH_INTERVAL_S = 60.0
MIN_HEALTH_INTERVAL_S = 1.0


def client_from_env(environ: Mapping[str, str], pack: str) -> Any:  # -> OracleClient | None
    """A started client for the service ``TURNOUT_URL`` names, or None when it names none.
    The variables are read as ``turnout launch`` reads them (``oracle.launch_inputs``).

    Raises:
        EngineConfigError: ``TURNOUT_HEALTH_INTERVAL_S`` is not a number of seconds of at
            least ``MIN_HEALTH_INTERVAL_S``.
    """
    if not environ.get("TURNOUT_URL", "").strip():
        return None
    text = environ.get("TURNOUT_HEALTH_INTERVAL_S", "").strip()
    try:
        interval = float(text) if text else DEFAULT_HEALTH_INTERVAL_S
    except ValueError:
        interval = -1.0
    # Below a second an engine would spool and send a report on nearly every loop.
    if not MIN_HEALTH_INTERVAL_S <= interval < float("inf"):
        raise EngineConfigError(
            f"TURNOUT_HEALTH_INTERVAL_S must be a number of seconds >= "
            f"{MIN_HEALTH_INTERVAL_S:g}, got {text!r}"
        )
    from turnout.oracle.client import OracleClient
    from turnout.oracle.launch import SERVICE_TIMEOUT_S, STARTUP_SLACK_S
    from turnout.oracle.launch_inputs import LaunchSettings

    settings = LaunchSettings.from_env(environ)
    # Start-up waits for the first snapshot as `turnout launch` does (the fetch's own deadline
    # and a little slack), not the client's 50 ms default: loading a model takes far longer,
    # and an engine that decided on the pack's defaults before the service answered would
    # run the wrong runner until its next restart.
    return OracleClient(
        settings.url,
        settings.token,
        cache_dir=settings.cache_dir,
        pack=pack,
        health_interval_s=interval,
        timeout_s=SERVICE_TIMEOUT_S,
        startup_wait_s=SERVICE_TIMEOUT_S + STARTUP_SLACK_S,
    ).start()


@dataclass
class Reporting:
    """What one engine holds for reporting: the client, the run marker, the recorder."""

    client: Any
    owns_client: bool
    marker: RunMarker | None = None
    recorder: HealthRecorder | None = None

    def start_health(self, decision: Any, deployment_id: str) -> None:
        """Hold the run marker and watch a recorder for the decided runner. A crash of the
        previous run is reported for the runner that run used: in this run's first window
        when it is the same, else in a report of its own (a V1 crash is no V2 crash because
        the restart decided V2)."""
        self.marker = RunMarker.acquire(
            Path(self.client.cache_dir) / "runs", deployment_id, runner=decision.runner
        )
        about = {
            "deployment_id": deployment_id,
            "family": decision.family or "unknown",
            "stage": decision.stage,
        }
        crashed = self.marker.crashed
        if crashed and self.marker.crashed_runner not in (None, decision.runner):
            now = dt.datetime.now(dt.UTC)
            try:
                self.client.report_health(
                    {
                        **about,
                        "runner": self.marker.crashed_runner,
                        "num_crashes": 1,
                        "window_start": now - dt.timedelta(milliseconds=1),
                        "window_end": now,
                        "num_requests": 0,
                        "num_errors": 0,
                    }
                )
            except OSError as err:  # a full disk does not stop the engine from starting
                logger.error(
                    "the crash of the previous run (%s) is not reported: the health "
                    "spool cannot be written (%s)",
                    self.marker.crashed_runner,
                    err,
                )
            crashed = False
        self.recorder = HealthRecorder(**about, runner=decision.runner, num_crashes=int(crashed))
        self.client.watch_health(self.recorder.cut)

    def end(self) -> None:
        """The engine ends cleanly: the last health report spooled, the client closed (when
        the engine made it), the run marked closed. Idempotent."""
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            self.client.unwatch_health(recorder.cut)
        if self.owns_client:
            self.owns_client = False
            self.client.close()
        if self.marker is not None:
            self.marker.release()


def deployment_id_from(environ: Mapping[str, str], given: str | None) -> str | None:
    """The deployment id given, else ``TURNOUT_DEPLOYMENT_ID`` (None: neither)."""
    return given or environ.get("TURNOUT_DEPLOYMENT_ID") or None


def default_environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


__all__ = ["Reporting", "client_from_env", "deployment_id_from"]
