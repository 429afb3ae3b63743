"""Read-side aggregates for the API and the pages, computed from the small tables kept at
ingest (``deployments``, ``daily_*``), never by scanning ``decision_events``."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dashboard.store.models import DailyDecisions, DailyReasons, Deployment

_PER_STAGE = ("rollout.stage_off", "rollout.split_out")


def reason_keys(rule_ids: list[str], reason_code: str, stage: str | None) -> list[str]:
    """What a fallback is attributed to: its rule ids, the per-stage rollout reasons split by
    stage (``rollout.stage_off:qwen3-canary``), or, with no rule at all, the reason code."""
    if not rule_ids:
        return [reason_code]
    return [f"{r}:{stage}" if r in _PER_STAGE and stage else r for r in rule_ids]


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
    return {f"rollout.stage_off:{c.cohort}": EnabledSince(c.cohort, c.updated_at, c.percentage)
            for c in canaries if c.enabled}


@dataclass
class FallbackReport:
    """Fallback reasons ranked by affected deployments, by family, and by day."""

    num_deployments: int = 0
    num_fallbacks: int = 0
    ranked: list[tuple[str, int]] = field(default_factory=list)  # (reason key, deployments)
    by_family: dict[str, Counter[str]] = field(default_factory=dict)  # family → key → n
    by_day: dict[str, dict[str, int]] = field(default_factory=dict)  # rule → day iso → events


def _demo_filter(stmt: Any, table: Any, include_demo: bool) -> Any:
    return stmt if include_demo else stmt.where(table.demo.is_(False))


def fallbacks(*, session: Session, include_demo: bool = True, days: int = 30,
              today: dt.date | None = None) -> FallbackReport:
    """Deployments whose latest decision is not V2, grouped by what sent them back."""
    report = FallbackReport()
    total = _demo_filter(select(func.count()).select_from(Deployment), Deployment, include_demo)
    report.num_deployments = int(session.scalar(total) or 0)
    stmt = select(Deployment.family, Deployment.reason_code, Deployment.stage,
                  Deployment.rule_ids, func.count()).where(
        (Deployment.runner.is_(None)) | (Deployment.runner != "v2")
    ).group_by(Deployment.family, Deployment.reason_code, Deployment.stage, Deployment.rule_ids)
    ranked: Counter[str] = Counter()
    by_family: dict[str, Counter[str]] = defaultdict(Counter)
    for family, reason_code, stage, rule_ids, n in session.execute(
            _demo_filter(stmt, Deployment, include_demo)):
        report.num_fallbacks += n
        for key in reason_keys(rule_ids, reason_code, stage):
            ranked[key] += n
            by_family[family][key] += n
    report.ranked = sorted(ranked.items(), key=lambda kv: (-kv[1], kv[0]))
    report.by_family = dict(sorted(by_family.items()))
    since = (today or dt.datetime.now(dt.UTC).date()) - dt.timedelta(days=days - 1)
    day_stmt = select(DailyReasons.rule_id, DailyReasons.day, func.sum(DailyReasons.num_events)
                      ).where(DailyReasons.day >= since).group_by(DailyReasons.rule_id,
                                                                  DailyReasons.day)
    by_day: dict[str, dict[str, int]] = defaultdict(dict)
    for rule_id, day, n in session.execute(_demo_filter(day_stmt, DailyReasons, include_demo)):
        by_day[rule_id][day.isoformat()] = int(n)
    report.by_day = dict(by_day)
    return report


@dataclass
class Overview:
    by_runner: dict[str, int]  # "v1" | "v2" | "none" → deployments
    by_stage: dict[str, dict[str, int]]  # stage → runner → deployments
    by_day: dict[str, dict[str, int]]  # day iso → runner → events


def overview(*, session: Session, include_demo: bool = True, days: int = 30,
             today: dt.date | None = None) -> Overview:
    stmt = select(Deployment.stage, Deployment.runner, func.count()).group_by(
        Deployment.stage, Deployment.runner)
    by_runner: Counter[str] = Counter()
    by_stage: dict[str, dict[str, int]] = defaultdict(dict)
    for stage, runner, n in session.execute(_demo_filter(stmt, Deployment, include_demo)):
        by_runner[runner or "none"] += n
        by_stage[stage or "-"][runner or "none"] = n
    since = (today or dt.datetime.now(dt.UTC).date()) - dt.timedelta(days=days - 1)
    day_stmt = select(DailyDecisions.day, DailyDecisions.runner,
                      func.sum(DailyDecisions.num_events)).where(
        DailyDecisions.day >= since).group_by(DailyDecisions.day, DailyDecisions.runner)
    by_day: dict[str, dict[str, int]] = defaultdict(dict)
    for day, runner, n in session.execute(_demo_filter(day_stmt, DailyDecisions, include_demo)):
        by_day[day.isoformat()][runner or "none"] = int(n)
    return Overview(dict(by_runner), dict(by_stage), dict(sorted(by_day.items())))


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


def recorded_deployments(*, session: Session, include_demo: bool = True
                         ) -> list[RecordedDeployment]:
    """Every deployment's latest decision with its config, by deployment id (the upgrade
    preview decides each again under two packs)."""
    stmt = select(Deployment.deployment_id, Deployment.pack, Deployment.family,
                  Deployment.runner, Deployment.config, Deployment.demo
                  ).order_by(Deployment.deployment_id)
    return [RecordedDeployment(*row) for row in session.execute(
        _demo_filter(stmt, Deployment, include_demo))]
