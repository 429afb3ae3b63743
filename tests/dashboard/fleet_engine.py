"""One engine of the closed-loop test, as a process, through the real engine client
(``oracle.client.OracleClient``): it decides its runner with the service's canaries, runs for
a short life reporting its health every few tenths of a second, then restarts and decides
again (so a ramp's new share reaches it). Its V2 runs are healthy, or crash in every window
while the mode file says ``crash``. Each decision event id and health report id is written to
``IDS`` once the client has spooled it (durable), so the test can check none was lost.

    python fleet_engine.py URL TOKEN DEPLOYMENT_ID CACHE_DIR MODE_FILE IDS
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from turnout.oracle import Decision, DeploymentConfig
from turnout.oracle.client import OracleClient

LIFE_WINDOWS = 4  # health windows per engine life, before it restarts and decides again
WINDOW_S = 0.25


def _fields(
    deployment: str, decision: Decision, start: dt.datetime, end: dt.datetime, crashing: bool
) -> dict[str, Any]:
    return {
        "deployment_id": deployment,
        "runner": decision.runner,
        "family": decision.family,
        "stage": decision.stage,
        "window_start": start.isoformat(),
        "window_end": end.isoformat(),
        "num_requests": 50,
        "num_errors": 0,
        "num_crashes": 1 if crashing else 0,
        "ttft_p50_ms": 40.0,
        "ttft_p99_ms": 90.0,
        "tpot_p50_ms": 10.0,
        "tpot_p99_ms": 20.0,
        "num_output_tokens": 5000,
        "output_tokens_per_s": 400.0,
    }


def main() -> None:
    url, token, deployment, cache, mode_file, ids_file = sys.argv[1:7]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = OracleClient(
        url,
        token,
        cache_dir=Path(cache),
        timeout_s=1.0,
        startup_wait_s=1.0,
        refresh_interval_s=0.2,
        flush_interval_s=0.1,
        health_interval_s=3600,
    ).start()
    config = DeploymentConfig(architecture="LlamaForCausalLM", deployment_id=deployment)
    with Path(ids_file).open("a") as ids:
        while not stop.is_set():
            decision = client.decide(config, report=False)
            ids.write(f"event {client.report(decision, config, deployment_id=deployment)}\n")
            start = dt.datetime.now(dt.UTC)
            for _ in range(LIFE_WINDOWS):
                if stop.wait(WINDOW_S):
                    break
                end = dt.datetime.now(dt.UTC)
                crashing = (
                    decision.runner == "v2" and Path(mode_file).read_text().strip() == "crash"
                )
                rid = client.report_health(_fields(deployment, decision, start, end, crashing))
                ids.write(f"health {rid}\n")
                ids.flush()
                start = end
                if crashing:
                    break  # a crashed engine starts again, and decides again
    client.close(flush_timeout_s=10)


if __name__ == "__main__":
    main()
