"""V1 and V2 health in one rollout stage, as ``GET /api/v1/health`` answers it and the Health
page shows it: the whole range per runner, and the same per time bucket.

The bucket size is the smallest of :data:`BUCKET_SIZES` that gives at most
:data:`MAX_BUCKETS` buckets over the range (the last hour: 1-minute buckets; a day: 15-minute
ones; a week: 6-hour ones), so a chart has a few dozen points whatever the range.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from turnout.dashboard.api.schemas import HealthOut, HealthOverTime, RunnerHealthOut
from turnout.dashboard.services import Services
from turnout.dashboard.store import health
from turnout.dashboard.store.models import EngineHealth

BUCKET_SIZES = (60, 300, 900, 3600, 21600, 86400, 604800)
MAX_BUCKETS = 120
DEFAULT_RANGE = dt.timedelta(hours=24)
# The page's windows: key → (title, length).
PAGE_WINDOWS = {
    "1h": ("the last hour", dt.timedelta(hours=1)),
    "24h": ("the last 24 hours", dt.timedelta(hours=24)),
    "7d": ("the last 7 days", dt.timedelta(days=7)),
}


class BadHealthQuery(ValueError):
    """A range or filter the view cannot show; ``field`` is the query parameter at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def bucket_size(since: dt.datetime, until: dt.datetime) -> int:
    """Seconds per bucket for ``[since, until)``.

    Raises:
        BadHealthQuery: ``since`` is not before ``until``, or the range needs more than
            ``MAX_BUCKETS`` of the largest size.
    """
    span = (until - since).total_seconds()
    if span <= 0:
        raise BadHealthQuery(
            "since", f"since ({since.isoformat()}) must be before until ({until.isoformat()})"
        )
    for size in BUCKET_SIZES:
        if span / size <= MAX_BUCKETS - 1:  # one more: the first bucket starts before since
            return size
    raise BadHealthQuery(
        "since",
        f"the range spans {span / 86400:.0f} days; at most "
        f"{(MAX_BUCKETS - 1) * BUCKET_SIZES[-1] // 86400} are shown",
    )


def check_filter(services: Services, stage: str, family: str | None) -> None:
    """Raises BadHealthQuery for a stage or family the pack does not have."""
    from turnout.dashboard.fallbacks import BadFilter
    from turnout.dashboard.fallbacks import check_filter as check

    try:
        check(services, family, stage)
    except BadFilter as err:
        raise BadHealthQuery(err.field, str(err)) from err


def runner_out(h: health.RunnerHealth | None) -> RunnerHealthOut | None:
    return None if h is None else RunnerHealthOut(**dataclasses.asdict(h))


def build(
    session: Session,
    *,
    stage: str,
    since: dt.datetime,
    until: dt.datetime,
    family: str | None = None,
) -> HealthOut:
    """The answer of ``GET /api/v1/health`` (filters already checked)."""
    size = bucket_size(since, until)
    whole = health.health_by_runner(session, stage=stage, since=since, until=until, family=family)
    series = health.health_over_time(
        session, stage=stage, since=since, until=until, bucket_s=size, family=family
    )
    return HealthOut(
        stage=stage,
        family=family,
        since=since,
        until=until,
        by_runner={r: RunnerHealthOut(**dataclasses.asdict(h)) for r, h in sorted(whole.items())},
        over_time=HealthOverTime(
            bucket_s=size,
            buckets=series.bucket_times(),
            by_runner={r: [runner_out(b) for b in v] for r, v in sorted(series.by_runner.items())},
        ),
    )


def latest_stage(session: Session, since: dt.datetime) -> str | None:
    """The stage of the most recent report ending after ``since`` (the page's default)."""
    h = EngineHealth
    newest = (
        select(func.max(h.end_s))
        .where(h.end_s >= health.epoch_s(since), h.stage.is_not(None))
        .scalar_subquery()
    )
    return session.scalars(
        select(h.stage).where(h.end_s == newest, h.stage.is_not(None)).limit(1)
    ).first()


def chart_data(out: HealthOut) -> dict[str, Any]:
    """What the page's script draws: bucket labels and, per chart, a series per runner."""
    ot = out.over_time
    fmt = "%m-%d %H:%M" if ot.bucket_s < 86400 else "%Y-%m-%d"
    series: dict[str, dict[str, list[float | None]]] = {}
    for key, scale in CHARTS.items():
        series[key] = {
            r: [_value(b, key, scale) for b in buckets] for r, buckets in ot.by_runner.items()
        }
    return {"labels": [b.strftime(fmt) for b in ot.buckets], "series": series}


# What the page charts (a RunnerHealth field) and the factor it is shown with.
CHARTS = {"tpot_p99_ms": 1.0, "ttft_p99_ms": 1.0, "error_rate": 100.0, "tokens_per_s": 1.0}


def _value(b: RunnerHealthOut | None, key: str, scale: float) -> float | None:
    """A point of a chart; None where the bucket has no such measure: no report, no finished
    request (no latency, no error rate), no token generated (no rate: a 0 would read as a
    runner that stalls, not one that idles)."""
    if b is None or (key == "error_rate" and b.num_requests == 0):
        return None
    v = getattr(b, key)
    return None if v is None or (key == "tokens_per_s" and v == 0) else float(v) * scale


def page_context(
    services: Services,
    session: Session,
    *,
    stage: str,
    window: str,
    family: str,
    now: dt.datetime | None = None,
) -> tuple[int, dict[str, Any]]:
    """The Health page's status and template context."""
    now = now or dt.datetime.now(dt.UTC)
    since = now - PAGE_WINDOWS[window][1]
    stages = [(c.id, c.label) for c in services.policy.pack.cohorts]
    chosen = stage or latest_stage(session, since) or stages[0][0]
    base: dict[str, Any] = {
        "stages": stages,
        "stage": chosen,
        "window": window,
        "windows": {k: t for k, (t, _) in PAGE_WINDOWS.items()},
        "family": family,
        "family_names": services.policy.family_names(),
    }
    try:
        check_filter(services, chosen, family or None)
    except BadHealthQuery as err:
        return 422, base | {"error": str(err)}
    out = build(session, stage=chosen, since=since, until=now, family=family or None)
    return 200, base | {
        "out": out,
        "since": since,
        "chart": chart_data(out),
        "rows": _rows(out.by_runner),
    }


def _rows(by_runner: Mapping[str, RunnerHealthOut]) -> list[tuple[str, str, str]]:
    """The summary table: (measure, V1, V2) as text."""

    def cell(runner: str, key: str, fmt: str) -> str:
        h = by_runner.get(runner)
        value = getattr(h, key) if h is not None else None
        return "—" if value is None else fmt.format(value)

    measures = [
        ("engines reporting", "num_engines", "{:d}"),
        ("reports", "num_reports", "{:d}"),
        ("requests", "num_requests", "{:,d}"),
        ("errors", "num_errors", "{:,d}"),
        ("error rate", "error_rate", "{:.2%}"),
        ("crashes", "num_crashes", "{:d}"),
        ("crashes per engine", "crash_rate", "{:.2f}"),
        ("TTFT p99 (ms)", "ttft_p99_ms", "{:.1f}"),
        ("TPOT p99 (ms)", "tpot_p99_ms", "{:.2f}"),
        ("output tokens/s per engine", "tokens_per_s", "{:,.0f}"),
    ]
    return [(label, cell("v1", key, fmt), cell("v2", key, fmt)) for label, key, fmt in measures]
