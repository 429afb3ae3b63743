"""Read-side aggregates for the API and the pages, computed from the small tables kept at
ingest (``latest_counts``, ``daily_decisions``, ``deployments``), never by scanning
``decision_events``.

The fallback report counts deployments by their latest decision: a deployment is in a time
window when its latest decision was made in it (a window starts on a 5-minute boundary, the
7-day one on an hour: the last hour is the buckets from ``floor_5min(now - 1h)`` on), and the
time chart counts the same deployments by the bucket of their latest decision, so that its
bars add up to the table.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from turnout.dashboard.store.latest_counts import (
    BUCKETS,
    KINDS,
    day_retention_s,
    first_day_kept,
    reason_keys,
    reason_kind,
)
from turnout.dashboard.store.models import DailyDecisions, Deployment, LatestCounts

__all__ = ["KINDS", "WINDOWS", "reason_keys", "reason_kind"]

Window = Literal["1h", "24h", "7d", "all"]
# window → (its span in seconds, None: everything; the time chart's bin in seconds; the
# boundary its start is rounded down to, seconds)
WINDOWS: dict[str, tuple[int | None, int, int]] = {
    "1h": (3600, 300, 300),
    "24h": (86400, 3600, 300),
    "7d": (7 * 86400, 6 * 3600, 3600),
    "all": (None, 86400, 86400),
}


@dataclass(frozen=True)
class EnabledSince:
    """A stage that is on now, as a fallback reason's key names it (``rollout.stage_off:X``):
    deployments that recorded that reason decided before the flip and keep their decision
    until they start (and report) again."""

    cohort: str
    since: dt.datetime  # the canary's last change (the flip that turned it on, or a share)
    percentage: int


def stages_enabled_since(canaries: list[Any]) -> dict[str, EnabledSince]:
    """``rollout.stage_off:<cohort>`` → :class:`EnabledSince` for every enabled canary."""
    return {
        f"rollout.stage_off:{c.cohort}": EnabledSince(c.cohort, c.updated_at, c.percentage)
        for c in canaries
        if c.enabled
    }


@dataclass(frozen=True)
class FleetFilter:
    """Which deployments a report counts (None: any)."""

    family: str | None = None
    stage: str | None = None  # the rollout stage (cohort id) of the latest decision
    pack: str | None = None
    include_demo: bool = True


@dataclass
class FamilyCounts:
    deployments: int = 0
    fallbacks: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)  # kind → deployments


@dataclass
class FallbackReport:
    """Deployments whose latest decision falls in ``window``, and those of them not on V2:
    by kind (blocked, waiting, held), by reason, by family and by time bin."""

    window: str = "all"
    since: dt.datetime | None = None  # the window's start (None: everything)
    bin_s: int = 86400  # the time chart's bin, seconds
    num_deployments: int = 0
    num_fallbacks: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)  # kind → deployments
    ranked: list[tuple[str, int]] = field(default_factory=list)  # (reason key, deployments)
    by_family: dict[str, Counter[str]] = field(default_factory=dict)  # family → key → n
    families: dict[str, FamilyCounts] = field(default_factory=dict)
    bins: list[dt.datetime] = field(default_factory=list)  # start of each time bin, UTC
    over_time: dict[str, list[int]] = field(default_factory=dict)  # key → n per bin


def window_start(window: str, now: dt.datetime) -> int | None:
    """The first second (epoch, UTC) a window counts: ``now`` minus its span, down to a
    5-minute boundary (1h, 24h) or an hour (7d); None for ``"all"``. Raises KeyError for an
    unknown window."""
    span, _bin, align = WINDOWS[window]
    if span is None:
        return None
    t = int(now.timestamp()) - span
    return t - t % align


def segments(start: int | None, bin_s: int) -> list[tuple[int, int | None, int | None]]:
    """(bucket size, first bucket, end) ranges of ``latest_counts`` that together cover the
    seconds from ``start`` on exactly once, each in the coarsest size that still divides
    ``bin_s``: 5-minute buckets up to the first full hour, hourly ones up to the next 6-hour
    boundary, and so on up to the coarsest. ``start`` is on a 5-minute boundary;
    the sizes read are kept for as long as ``WINDOWS`` reach back (``RETENTION_S``)."""
    sizes = [s for s in BUCKETS if bin_s % s == 0]
    if start is None:
        return [(sizes[-1], None, None)]
    out: list[tuple[int, int | None, int | None]] = []
    t = start
    for size, coarser in itertools.pairwise(sizes):
        boundary = -(-t // coarser) * coarser
        if boundary > t:
            out.append((size, t, boundary))
            t = boundary
    out.append((sizes[-1], t, None))
    return out


def _where(
    segment: tuple[int, int | None, int | None], f: FleetFilter
) -> list[ColumnElement[bool]]:
    t = LatestCounts
    size, lo, hi = segment
    where = [t.bucket_s == size, t.num_deployments != 0]
    if lo is not None:
        where.append(t.bucket >= lo)
    if hi is not None:
        where.append(t.bucket < hi)
    for column, value in ((t.family, f.family), (t.stage, f.stage), (t.pack, f.pack)):
        if value is not None:
            where.append(column == value)
    if not f.include_demo:
        where.append(t.demo.is_(False))
    return where


def fallbacks(
    *,
    session: Session,
    window: str = "all",
    fleet: FleetFilter | None = None,
    include_demo: bool = True,
    now: dt.datetime | None = None,
) -> FallbackReport:
    """Deployments whose latest decision falls in ``window`` (``WINDOWS``), those not on V2
    ranked by what sent them back, by family and by time bin. Reads ``latest_counts`` only.

    Raises KeyError for a window not in ``WINDOWS``."""
    fleet = fleet or FleetFilter(include_demo=include_demo)
    now = now or dt.datetime.now(dt.UTC)
    start = window_start(window, now)
    if start is None:  # all: the days the database keeps
        start = first_day_kept(now, day_retention_s(session.connection()))
    bin_s = WINDOWS[window][1]
    segs = segments(start, bin_s)
    report = FallbackReport(
        window=window,
        bin_s=bin_s,
        since=None if start is None else dt.datetime.fromtimestamp(start, dt.UTC),
    )
    t = LatestCounts
    totals = select(t.reason, t.kind, t.family, t.runner, func.sum(t.num_deployments)).group_by(
        t.reason, t.kind, t.family, t.runner
    )
    timed = (
        select(t.bucket, t.reason, func.sum(t.num_deployments))
        .where(t.reason != "")
        .group_by(t.bucket, t.reason)
    )
    ranked: Counter[str] = Counter()
    by_family: dict[str, Counter[str]] = defaultdict(Counter)
    families: dict[str, FamilyCounts] = defaultdict(FamilyCounts)
    per_bin: dict[str, Counter[int]] = defaultdict(Counter)
    for seg in segs:
        for reason, kind, family, runner, n in session.execute(totals.where(*_where(seg, fleet))):
            n = int(n)
            if reason:
                ranked[reason] += n
                by_family[family][reason] += n
                continue
            fam = families[family]
            fam.deployments += n
            report.num_deployments += n
            if runner != "v2":
                fam.fallbacks += n
                fam.by_kind[kind] += n
                report.num_fallbacks += n
                report.by_kind[kind] += n
        for bucket, reason, n in session.execute(timed.where(*_where(seg, fleet))):
            per_bin[reason][bucket - bucket % bin_s] += int(n)
    report.ranked = sorted(ranked.items(), key=lambda kv: (-kv[1], kv[0]))
    report.by_family = dict(sorted(by_family.items()))
    report.families = dict(sorted(families.items()))
    _fill_bins(report, per_bin, start, now)
    return report


def _fill_bins(
    report: FallbackReport, per_bin: dict[str, Counter[int]], start: int | None, now: dt.datetime
) -> None:
    """Every bin from the window's start (or the first with data) to now (or the last with
    data: an event may be dated a little ahead), each reason's count per bin (0 when none)."""
    b = report.bin_s
    seen = [k for c in per_bin.values() for k in c]
    now_bin = int(now.timestamp()) // b * b
    first = start - start % b if start is not None else min(seen, default=now_bin)
    last = max([now_bin, *seen])
    keys = range(first, last + b, b)
    report.bins = [dt.datetime.fromtimestamp(k, dt.UTC) for k in keys]
    report.over_time = {
        reason: [per_bin[reason].get(k, 0) for k in keys]
        for reason, _n in report.ranked
        if reason in per_bin
    }


@dataclass
class Overview:
    by_runner: dict[str, int]  # "v1" | "v2" | "none" → deployments
    by_stage: dict[str, dict[str, int]]  # stage → runner → deployments
    by_day: dict[str, dict[str, int]]  # day iso → runner → events


def overview(
    *, session: Session, include_demo: bool = True, days: int = 30, today: dt.date | None = None
) -> Overview:
    """Every deployment by the stage and runner of its latest decision (from the day buckets
    of ``latest_counts``, which count each deployment once; those the database keeps), and
    events per day and runner."""
    t = LatestCounts
    stmt = (
        select(t.stage, t.runner, func.sum(t.num_deployments))
        .where(t.bucket_s == BUCKETS[-1], t.reason == "")
        .group_by(t.stage, t.runner)
    )
    first = first_day_kept(dt.datetime.now(dt.UTC), day_retention_s(session.connection()))
    if first is not None:
        stmt = stmt.where(t.bucket >= first)
    if not include_demo:
        stmt = stmt.where(t.demo.is_(False))
    by_runner: Counter[str] = Counter()
    by_stage: dict[str, dict[str, int]] = defaultdict(dict)
    for stage, runner, n in session.execute(stmt):
        if not n:
            continue
        by_runner[runner or "none"] += int(n)
        by_stage[stage or "-"][runner or "none"] = int(n)
    since = (today or dt.datetime.now(dt.UTC).date()) - dt.timedelta(days=days - 1)
    day_stmt = (
        select(DailyDecisions.day, DailyDecisions.runner, func.sum(DailyDecisions.num_events))
        .where(DailyDecisions.day >= since)
        .group_by(DailyDecisions.day, DailyDecisions.runner)
    )
    if not include_demo:
        day_stmt = day_stmt.where(DailyDecisions.demo.is_(False))
    by_day: dict[str, dict[str, int]] = defaultdict(dict)
    for day, runner, n in session.execute(day_stmt):
        by_day[day.isoformat()][runner or "none"] = int(n)
    return Overview(dict(by_runner), dict(by_stage), dict(sorted(by_day.items())))


def _demo_filter(stmt: Any, table: Any, include_demo: bool) -> Any:
    return stmt if include_demo else stmt.where(table.demo.is_(False))


def deployments_for_impact(*, session: Session) -> list[Deployment]:
    """Deployments that carry their config (the impact preview re-decides them)."""
    return list(session.scalars(select(Deployment).where(Deployment.config.is_not(None))))


class RecordedDeployment(NamedTuple):
    """A deployment's latest recorded decision and the config it reported (None when the
    engine sent none)."""

    deployment_id: str
    pack: str
    family: str
    runner: str | None
    config: dict[str, Any] | None
    demo: bool


def recorded_deployments(
    *, session: Session, include_demo: bool = True
) -> list[RecordedDeployment]:
    """Every deployment's latest decision with its config, by deployment id (the upgrade
    preview decides each again under two packs)."""
    stmt = select(
        Deployment.deployment_id,
        Deployment.pack,
        Deployment.family,
        Deployment.runner,
        Deployment.config,
        Deployment.demo,
    ).order_by(Deployment.deployment_id)
    return [
        RecordedDeployment(*row)
        for row in session.execute(_demo_filter(stmt, Deployment, include_demo))
    ]
