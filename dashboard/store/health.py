"""Runtime health reported by engines: ingest (idempotent by report id) and the aggregates per
stage and runner over a time range and over time buckets.

Each stored row is one engine's window (``oracle.wire.HealthReportIn``). A range holds the
reports whose window *ended* in it (``since <= window_end < until``). Over a range, per runner:

* counts are sums (requests, errors, crashes, output tokens); ``num_engines`` counts distinct
  deployment ids;
* ``error_rate`` = errors / max(requests, 1); ``crash_rate`` = crashes / max(engines, 1);
* ``tokens_per_s`` = output tokens / seconds spent generating them, summed over reports: the
  rate of one engine while it works, whatever the number of engines or idle time (a fleet
  total would grow with V2's share and say nothing of V2 itself);
* the p99 latencies are the **request-weighted mean of the reported p99s**, not the max: a
  max grows with the number of reports (more engines, more chances of one slow window), so
  during a ramp the runner on more engines (V1) would look worse for that alone; the weighted
  mean does not depend on how many engines report, equals the true p99 when the windows are
  alike, and leaves a single sick engine to the error and crash rates. It is not the fleet's
  p99 (percentiles do not add up), which no aggregate of per-window percentiles can give.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Float, and_, case, cast, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from turnout.dashboard.store.models import EngineHealth
from turnout.oracle.wire import MAX_HEALTH_WINDOW, HealthReportIn

RUNNERS = ("v1", "v2")


@dataclass(frozen=True)
class RunnerHealth:
    runner: str  # "v1" | "v2"
    num_reports: int
    num_engines: int  # distinct deployment ids reporting in the window
    num_requests: int
    num_errors: int
    num_crashes: int
    error_rate: float  # num_errors / max(num_requests, 1)
    crash_rate: float  # num_crashes / max(num_engines, 1)
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    tokens_per_s: float


def epoch_s(t: dt.datetime, *, up: bool = False) -> int:
    """Whole seconds since the epoch of an aware time (the ``end_s`` column's unit), rounded
    down (``up``: rounded up)."""
    s = t.astimezone(dt.UTC).timestamp()
    return int(-(-s // 1)) if up else int(s // 1)


def ingest_reports(*, session: Session, reports: Sequence[HealthReportIn]) -> int:
    """Store the reports not stored yet (the first copy of a report id wins, in the batch as
    across batches); the caller commits. Returns how many were new."""
    rows: dict[str, dict[str, Any]] = {}
    for r in reports:
        rows.setdefault(r.report_id, _row(r))
    if not rows:
        return 0
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = insert(EngineHealth).on_conflict_do_nothing(index_elements=["report_id"])
    inserted = session.scalars(stmt.returning(EngineHealth.report_id), list(rows.values()))
    return len(inserted.all())


def _row(r: HealthReportIn) -> dict[str, Any]:
    row = r.model_dump()
    row["end_s"] = epoch_s(r.window_end)
    row["received_at"] = dt.datetime.now(dt.UTC)
    return row


def _aggregates() -> list[ColumnElement[Any]]:
    h = EngineHealth
    # A window counts for tokens/s when its rate is one an engine can have (ingest refuses
    # others; rows an older service stored may have them): its busy time at most a day, so
    # that no division overflows a float (PostgreSQL refuses the read then). Summed as floats:
    # SQLite's sum() of integers raises beyond 64 bits.
    timed = (
        h.output_tokens_per_s * (MAX_HEALTH_WINDOW.total_seconds() * (1 + 1e-9))
        >= h.num_output_tokens
    )
    timed = and_(h.output_tokens_per_s > 0, timed)
    timed_tokens = case((timed, cast(h.num_output_tokens, Float)), else_=0.0)
    busy_s = case((timed, h.num_output_tokens / h.output_tokens_per_s), else_=0.0)
    out: list[ColumnElement[Any]] = [
        func.count(),
        func.count(h.deployment_id.distinct()),
        func.sum(h.num_requests),
        func.sum(h.num_errors),
        func.sum(h.num_crashes),
        func.sum(timed_tokens),
        func.sum(busy_s),
    ]
    for p99 in (h.ttft_p99_ms, h.tpot_p99_ms):
        weight = case((p99.is_not(None), h.num_requests), else_=0)
        out += [
            func.sum(case((p99.is_not(None), p99 * h.num_requests), else_=0.0)),
            func.sum(weight),
        ]
    return out


def _health(runner: str, values: Sequence[Any]) -> RunnerHealth:
    (
        reports,
        engines,
        requests,
        errors,
        crashes,
        tokens,
        busy_s,
        ttft_sum,
        ttft_weight,
        tpot_sum,
        tpot_weight,
    ) = values
    requests, errors, crashes = int(requests or 0), int(errors or 0), int(crashes or 0)
    return RunnerHealth(
        runner=runner,
        num_reports=int(reports),
        num_engines=int(engines),
        num_requests=requests,
        num_errors=errors,
        num_crashes=crashes,
        error_rate=errors / max(requests, 1),
        crash_rate=crashes / max(int(engines), 1),
        ttft_p99_ms=float(ttft_sum) / int(ttft_weight) if ttft_weight else None,
        tpot_p99_ms=float(tpot_sum) / int(tpot_weight) if tpot_weight else None,
        tokens_per_s=float(tokens or 0) / float(busy_s) if busy_s else 0.0,
    )


def _where(
    stage: str | None, since: dt.datetime, until: dt.datetime | None, family: str | None
) -> list[ColumnElement[bool]]:
    h = EngineHealth
    cond = [h.end_s >= epoch_s(since)]
    if stage is not None:
        cond.append(h.stage == stage)
    if until is not None:  # rounded up: a report ending in until's own second is in
        cond.append(h.end_s < epoch_s(until, up=True))
    if family is not None:
        cond.append(h.family == family)
    return cond


def health_by_runner(
    session: Session,
    *,
    stage: str,
    since: dt.datetime,
    until: dt.datetime | None = None,
    family: str | None = None,
) -> dict[str, RunnerHealth]:
    """Health per runner of the engines of rollout ``stage`` (a cohort id) whose report
    windows ended in ``[since, until)`` (``until`` None: now and later), of one ``family``
    when given. Only runners with reports appear (an empty dict: no report). ``since`` and
    ``until`` are aware times, read to the second: a report ending in ``since``'s second is
    in, and so is one ending in ``until``'s (``until=now`` takes every report so far)."""
    stmt = (
        select(EngineHealth.runner, *_aggregates())
        .where(*_where(stage, since, until, family))
        .group_by(EngineHealth.runner)
    )
    return {r[0]: _health(r[0], r[1:]) for r in session.execute(stmt)}


def health_by_stage(
    session: Session, *, since: dt.datetime, until: dt.datetime | None = None
) -> dict[tuple[str, str], RunnerHealth]:
    """:func:`health_by_runner` for every stage at once: (stage, runner) → its health (reports
    without a stage are left out)."""
    h = EngineHealth
    stmt = (
        select(h.stage, h.runner, *_aggregates())
        .where(h.stage.is_not(None), *_where(None, since, until, None))
        .group_by(h.stage, h.runner)
    )
    return {(r[0], r[1]): _health(r[1], r[2:]) for r in session.execute(stmt)}


@dataclass(frozen=True)
class HealthSeries:
    """Health per runner over consecutive buckets of ``bucket_s`` seconds from ``start``
    (aligned to a multiple of ``bucket_s`` since the epoch): ``by_runner[runner][i]`` is the
    health of bucket ``i`` (None: no report in it)."""

    start: dt.datetime
    bucket_s: int
    num_buckets: int
    by_runner: dict[str, list[RunnerHealth | None]]

    def bucket_times(self) -> list[dt.datetime]:
        return [
            self.start + dt.timedelta(seconds=i * self.bucket_s) for i in range(self.num_buckets)
        ]


def health_over_time(
    session: Session,
    *,
    stage: str,
    since: dt.datetime,
    until: dt.datetime,
    bucket_s: int,
    family: str | None = None,
) -> HealthSeries:
    """:func:`health_by_runner` per time bucket of ``bucket_s`` seconds, the buckets that
    ``[since, until)`` touches (each report in the bucket its window ended in).

    Raises:
        ValueError: ``bucket_s`` below 1, or more than 2,000 buckets.
    """
    if bucket_s < 1:
        raise ValueError(f"bucket_s must be at least 1, got {bucket_s}")
    first = epoch_s(since) // bucket_s * bucket_s
    num = max(1, -(-(epoch_s(until, up=True) - first) // bucket_s))
    if num > 2_000:
        raise ValueError(f"{num} buckets of {bucket_s} s: at most 2,000")
    bucket = EngineHealth.end_s // bucket_s * bucket_s
    stmt = (
        select(EngineHealth.runner, bucket, *_aggregates())
        .where(*_where(stage, since, until, family))
        .group_by(EngineHealth.runner, bucket)
    )
    series: dict[str, list[RunnerHealth | None]] = {r: [None] * num for r in RUNNERS}
    for row in session.execute(stmt):
        index = (int(row[1]) - first) // bucket_s
        if 0 <= index < num:
            series.setdefault(row[0], [None] * num)[index] = _health(row[0], row[2:])
    return HealthSeries(dt.datetime.fromtimestamp(first, dt.UTC), bucket_s, num, series)
