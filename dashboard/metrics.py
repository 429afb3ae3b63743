"""Prometheus metrics (``GET /metrics``): decisions by runner and reason code, API latency,
engine health per stage and runner (``dashboard/metrics_health.py``), and the closed loop's
work in this process: ramp steps, gate failures by gate, pauses and rollbacks (the ramp
ticker's passes), webhook deliveries and failed attempts (the delivery worker's), and
Alertmanager's alerts received and the changes they made (``POST /api/v1/alertmanager``).

Each app has its own registry (several apps in one test process must not collide). Latency is
measured by a plain ASGI middleware (no per-request task or body copy), labelled by the route
template, not the raw path, so label cardinality stays bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from turnout.dashboard.store.advance import RampTick
    from turnout.dashboard.store.delivery import DeliveryReport

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "MetricsMiddleware"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "turnout_decisions",
            "Decisions made by POST /decide (source=api) or reported by "
            "engines (source=ingest), by runner and reason code",
            ["source", "runner", "reason_code"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "turnout_api_request_duration_seconds",
            "Service request latency",
            ["method", "route", "status"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.canary_flips = Counter(
            "turnout_canary_flips", "Successful canary flips", ["cohort"], registry=self.registry
        )
        self.startup_lines = Counter(
            "turnout_startup_lines",
            "vLLM start-up lines (turnout launch --report-startup) "
            "kept with their decision, by whether vLLM's runner is the decided one (agrees) or "
            "not (differs)",
            ["outcome"],
            registry=self.registry,
        )
        self.health_reports = Counter(
            "turnout_health_reports",
            "Engine health reports received, by outcome (stored or rejected)",
            ["outcome"],
            registry=self.registry,
        )
        self._loop_counters()
        self._alert_counters()

    def _loop_counters(self) -> None:
        """The closed loop's counters: what this process's ramp ticker and delivery worker did
        (every replica runs both; Prometheus sums the replicas)."""
        r = self.registry
        self.ramp_steps = Counter(
            "turnout_ramp_steps",
            "Ramp steps taken: the next share applied once the step "
            "before baked with every gate passing (the first share, applied at the start, is "
            "not counted)",
            ["cohort"],
            registry=r,
        )
        self.ramps_completed = Counter(
            "turnout_ramps_completed",
            "Ramps whose last step baked with every gate passing",
            ["cohort"],
            registry=r,
        )
        self.gate_failures = Counter(
            "turnout_ramp_gate_failures",
            "Gates that failed a ramp, by gate (each failing gate "
            "of a pass that paused the ramp or rolled its stage back)",
            ["cohort", "gate"],
            registry=r,
        )
        self.ramp_pauses = Counter(
            "turnout_ramp_pauses", "Ramps a failing gate paused", ["cohort"], registry=r
        )
        self.ramp_rollbacks = Counter(
            "turnout_ramp_rollbacks",
            "Stages a failing gate rolled back (the canary disabled)",
            ["cohort"],
            registry=r,
        )
        self.webhook_deliveries = Counter(
            "turnout_webhook_deliveries",
            "Webhook deliveries that ended: delivered (a 2xx) or dead (the last attempt failed)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("delivered", "dead"):
            self.webhook_deliveries.labels(outcome)
        self.webhook_failed_attempts = Counter(
            "turnout_webhook_failed_attempts",
            "Webhook delivery attempts without a 2xx "
            "(another status, a refused connection, a timeout), a dead delivery's last one "
            "included",
            registry=r,
        )

    def _alert_counters(self) -> None:
        """What ``POST /api/v1/alertmanager`` received and did in this process."""
        self.alerts_received = Counter(
            "turnout_alerts_received",
            "Alerts of Alertmanager's notifications, by the service's receiver and the "
            "alert's status (firing or resolved), repeats included",
            ["receiver", "status"],
            registry=self.registry,
        )
        self.alert_actions = Counter(
            "turnout_alert_actions",
            "Changes alerts made (pause, rollback, kill_switch): one per stage and firing, "
            "not the alerts that found the change made",
            ["action"],
            registry=self.registry,
        )
        for action in ("pause", "rollback", "kill_switch"):
            self.alert_actions.labels(action)

    def count_ramp_ticks(self, ticks: list[RampTick]) -> None:
        """Count what one pass of the ramp ticker did (after its commits)."""
        for t in ticks:
            if t.outcome == "stepped":
                self.ramp_steps.labels(t.cohort).inc()
            elif t.outcome == "completed":
                self.ramps_completed.labels(t.cohort).inc()
            elif t.outcome in ("paused", "rolled_back"):
                for g in t.gates:
                    if g.status == "fail":
                        self.gate_failures.labels(t.cohort, g.gate).inc()
                (self.ramp_pauses if t.outcome == "paused" else self.ramp_rollbacks).labels(
                    t.cohort
                ).inc()

    def count_deliveries(self, report: DeliveryReport) -> None:
        """Count what one pass of the delivery worker did."""
        self.webhook_deliveries.labels("delivered").inc(len(report.delivered))
        self.webhook_deliveries.labels("dead").inc(len(report.dead))
        self.webhook_failed_attempts.inc(len(report.retried) + len(report.dead))

    def watch_health(
        self, sessions: Callable[[], AbstractContextManager[Session]], window_s: float
    ) -> None:
        """Export engine health from the store at each scrape (dashboard/metrics_health.py)."""
        from turnout.dashboard.metrics_health import HealthCollector

        self.registry.register(HealthCollector(sessions, window_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # (method, route, status) → its histogram child: labels() costs more than observe().
        self._children: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - start
            key = (scope["method"], route_label(scope), status)
            child = self._children.get(key)
            if child is None:
                child = self.metrics.request_seconds.labels(key[0], key[1], str(status))
                if len(self._children) < 10_000:  # bounded: routes x methods x statuses
                    self._children[key] = child
            child.observe(elapsed)


def route_label(scope: Scope) -> str:
    """The matched route's template with the prefix it was included under
    (``/api/v1/canaries/{cohort}``), or ``unmatched``."""
    route: Any = scope.get("route")
    template = getattr(route, "path", None)
    if not template:
        return "unmatched"
    path = str(scope.get("path", ""))
    head = template.split("{", 1)[0]
    if path.startswith(head):
        return str(template)
    # Routers included with a prefix may report the template without it.
    at = path.find(head)
    return path[:at] + template if at > 0 else str(template)
