"""The service's background work, started and stopped with the app (its lifespan): the ramp
ticker (scheduled flips, then ramps, every ``tick_s``) and the webhook delivery worker (the
outbox, every ``webhook_poll_s``). Each pass is a plain function of an explicit time
(:func:`tick`, :func:`deliver`), run in a worker thread; a pass that fails is logged and the
next one runs as planned.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from turnout.dashboard import engine_fleet, promql
from turnout.dashboard.gates import PromqlReading
from turnout.dashboard.services import Services
from turnout.dashboard.store import advance, delivery, schedule
from turnout.dashboard.store.models import ServiceMeta, utcnow
from turnout.dashboard.store.models_rollout import Ramp
from turnout.dashboard.store.ramps import RampState

log = logging.getLogger("turnout.service")


@dataclass(frozen=True)
class TickReport:
    flips: list[schedule.FlipRun]
    ramps: list[advance.RampTick]

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.flips) or any(
            r.outcome not in ("held", "skipped") for r in self.ramps
        )


def _idle(services: Services, now: dt.datetime, *, deliveries: bool) -> bool:
    """Nothing for a pass to do at ``now``: asked in a read transaction first, so that an
    idle service takes no write lock every second (SQLite has one writer)."""
    from sqlalchemy import ColumnElement, exists, or_, select

    from turnout.dashboard.store.models_rollout import OutboxEntry, Ramp, ScheduledFlip
    from turnout.dashboard.store.ramps import RampState
    from turnout.dashboard.store.webhooks import OutboxState

    work: ColumnElement[bool]
    if deliveries:
        work = exists().where(
            OutboxEntry.state == OutboxState.pending,
            OutboxEntry.next_attempt_at <= now,
            or_(OutboxEntry.leased_until.is_(None), OutboxEntry.leased_until <= now),
        )
    else:
        work = or_(
            exists().where(Ramp.state == RampState.active),
            exists().where(
                ScheduledFlip.state == schedule.FlipState.scheduled, ScheduledFlip.run_at <= now
            ),
        )
    with services.db.read_session() as session:
        return not session.scalar(select(work))


def querier(services: Services) -> promql.Querier:
    """The PromQL gates' Prometheus (``TURNOUT_PROMETHEUS_URL``), or the querier that says
    none is configured."""
    s = services.settings
    if not s.prometheus_url:
        return promql.unconfigured
    auth = s.prometheus_authorization.get_secret_value() if s.prometheus_authorization else None
    return promql.Prometheus(s.prometheus_url, s.prometheus_timeout_s, auth).query


def promql_readings(services: Services, now: dt.datetime) -> dict[int, dict[str, PromqlReading]]:
    """Every active ramp's PromQL gates asked of Prometheus at ``now``, in no transaction
    (a slow Prometheus holds no lock)."""
    with services.db.read_session() as session:
        active = [
            (r.id, r.cohort, dict(r.gates))
            for r in session.scalars(select(Ramp).where(Ramp.state == RampState.active))
        ]
    return promql.read_gates(active, querier(services), now)


def restart_notices(services: Services, now: dt.datetime) -> int | None:
    """A ``restart_required`` notice when the canary state changed since the last one
    (:func:`engine_fleet.restart_notice`); asked in a read transaction first, so that an
    unchanged state takes no write lock. Returns how many engines it named (None: nothing
    changed)."""
    snap = services.policy.snapshot()
    with services.db.read_session() as session:
        meta = session.get(ServiceMeta, engine_fleet.RESTART_NOTICE_KEY)
        if meta is not None and meta.value == snap.etag:
            return None
    ttl = dt.timedelta(seconds=services.settings.engine_ttl_s)
    with services.db.write_session() as session:
        stale = engine_fleet.restart_notice(
            session, services.policy, snap.canaries, snap.etag, now, ttl
        )
        session.commit()
    if stale:
        log.info("canary state %s: %d engines need a restart", snap.etag, len(stale))
    return None if stale is None else len(stale)


def tick(services: Services, now: dt.datetime) -> TickReport:
    """Apply the scheduled flips due at ``now``, then advance every active ramp (its PromQL
    gates asked first)."""
    from turnout.dashboard.health_source import health_reader

    if _idle(services, now, deliveries=False):
        return TickReport([], [])
    readings = promql_readings(services, now)
    with services.db.write_session() as session:
        flips = schedule.run_scheduled(session=session, now=now)
        ticks = advance.advance_ramps(
            session=session,
            now=now,
            named=services.policy.cohort_families(),
            health=health_reader(),
            promql=readings,
        )
    report = TickReport(flips, ticks)
    services.metrics.count_ramp_ticks(ticks)
    if report.changed:
        services.policy.invalidate()
        for r in ticks:
            if r.outcome != "held" and r.outcome != "skipped":
                log.info("ramp %d (%s): %s", r.ramp_id, r.cohort, r.outcome)
    return report


def ticker_pass(services: Services) -> None:
    """One pass of the ramp ticker: :func:`tick`, then :func:`restart_notices` (a flip from
    the API, a page or a ramp alike)."""
    tick(services, utcnow())
    restart_notices(services, utcnow())


def retry_policy(services: Services) -> delivery.RetryPolicy:
    s = services.settings
    return delivery.RetryPolicy(
        max_attempts=s.webhook_max_attempts,
        backoff_s=s.webhook_backoff_s,
        max_backoff_s=s.webhook_max_backoff_s,
        lease_s=s.webhook_lease_s,
        timeout_s=s.webhook_timeout_s,
    )


def deliver(
    services: Services,
    now: dt.datetime,
    rng: random.Random | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> delivery.DeliveryReport:
    """Send the webhook deliveries due at ``now`` (none started once ``stopping()``)."""
    policy = retry_policy(services)
    if _idle(services, now, deliveries=True):
        return delivery.DeliveryReport()
    with services.db.write_session() as session:
        report = delivery.deliver_due(
            session=session,
            now=now,
            post=delivery.httpx_poster(policy.timeout_s, services.settings.egress),
            policy=policy,
            rng=rng,
            stopping=stopping,
        )
    services.metrics.count_deliveries(report)
    return report


@dataclass
class Workers:
    """The running loops; :meth:`stop` ends them (the pass under way finishes first; a
    delivery pass starts no further attempt once stopping)."""

    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def stop(self) -> None:
        self.stop_event.set()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _loop(name: str, every_s: float, work: Callable[[], object], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await run_in_threadpool(work)
        except Exception:
            log.exception("%s pass failed; the next one runs in %.1f s", name, every_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)


def start(services: Services) -> Workers:
    """Start the ramp ticker and the delivery worker on the running event loop."""
    workers = Workers()
    rng = random.Random()
    s = services.settings
    workers.tasks = [
        asyncio.create_task(
            _loop("ramp ticker", s.tick_s, lambda: ticker_pass(services), workers.stop_event)
        ),
        asyncio.create_task(
            _loop(
                "webhook delivery",
                s.webhook_poll_s,
                lambda: deliver(services, utcnow(), rng, workers.stop_event.is_set),
                workers.stop_event,
            )
        ),
    ]
    return workers
