"""Engine health on ``/metrics``: per rollout stage and runner, over the last
``TURNOUT_HEALTH_METRICS_WINDOW_S`` seconds (default 15 minutes), read from the store at each
scrape (one grouped query over the recent reports; ``dashboard/store/health.py`` says how the
reports are aggregated).

A store that cannot be read gives no health samples for that scrape (logged), never a failed
scrape: the service's other metrics stay available while the database is away.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from turnout.dashboard.store.health import RunnerHealth, health_by_stage

log = logging.getLogger("turnout.service")

# metric name → (help, the RunnerHealth field it shows)
GAUGES: dict[str, tuple[str, str]] = {
    "turnout_engine_error_rate": ("Failed requests over finished requests", "error_rate"),
    "turnout_engine_crashes": (
        "Engine starts after an unclean end (crashes, kills)",
        "num_crashes",
    ),
    "turnout_engine_tpot_p99_ms": (
        "Time per output token, p99 (request-weighted mean of the engines' p99s), milliseconds",
        "tpot_p99_ms",
    ),
    "turnout_engine_ttft_p99_ms": (
        "Time to first token, p99 (request-weighted mean of the engines' p99s), milliseconds",
        "ttft_p99_ms",
    ),
    "turnout_engine_output_tokens_per_second": (
        "Output tokens per second of one engine while it generates",
        "tokens_per_s",
    ),
    "turnout_engines_reporting": ("Distinct deployments that reported health", "num_engines"),
}


class HealthCollector(Collector):
    """Collects the gauges of :data:`GAUGES` from the store at each scrape."""

    def __init__(
        self, sessions: Callable[[], AbstractContextManager[Session]], window_s: float
    ) -> None:
        self.sessions = sessions
        self.window_s = window_s

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # collected lazily: no store read at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.window_s)
        try:
            with self.sessions() as session:
                rows = health_by_stage(session, since=since)
        except SQLAlchemyError as err:
            log.warning("engine health metrics skipped: the store cannot be read (%s)", err)
            return
        yield from families(rows, self.window_s)


def families(
    rows: dict[tuple[str, str], RunnerHealth], window_s: float
) -> Iterator[GaugeMetricFamily]:
    for name, (text, field) in GAUGES.items():
        family = GaugeMetricFamily(
            name,
            f"{text}, per rollout stage and runner, over the last {window_s:g} s",
            labels=["stage", "runner"],
        )
        for (stage, runner), h in sorted(rows.items()):
            value = getattr(h, field)
            if value is not None:
                family.add_metric([stage, runner], float(value))
        yield family
