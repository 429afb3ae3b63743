"""The serving engines the service knows, as an operator and a Prometheus read them:
Prometheus' HTTP service discovery targets, and each engine with the runner the current
canary snapshot would give it (an engine whose runner differs still runs an old decision and
needs a restart: a kill switch or a flip reaches an engine when it restarts).

The HTTP SD format is Prometheus' (``http_sd_config``, docs "HTTP SD"): a JSON list of
``{"targets": ["host:port"], "labels": {...}}``; ``__metrics_path__`` and ``__scheme__`` set
where the target is scraped, and every other label is attached to its series.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from turnout.dashboard.impact import spec_config, spec_with_id
from turnout.dashboard.policy import Policy
from turnout.dashboard.services import Services
from turnout.dashboard.store import audit, webhooks
from turnout.dashboard.store.engines import live
from turnout.dashboard.store.models import Engine, ServiceMeta, utcnow
from turnout.oracle.decision import CanarySnapshot


def target_labels(e: Engine) -> dict[str, str]:
    """The labels of one engine's scrape target: where to scrape it, and the rollout's view
    of it (``turnout_cohort`` is ``canary`` or ``baseline``)."""
    return {
        "__metrics_path__": e.metrics_path,
        "__scheme__": e.scheme,
        "turnout_deployment": e.deployment_id,
        "turnout_stage": e.stage or "",
        "turnout_family": e.family,
        "turnout_runner": e.runner,
        "turnout_cohort": e.cohort,
        "turnout_engine": e.engine,
        "turnout_engine_id": e.engine_id,
        "turnout_decision_digest": e.policy_digest,
        "vllm_version": e.vllm_version,
    }


def prometheus_targets(engines: Sequence[Engine]) -> list[dict[str, Any]]:
    """One target group per live engine (each has labels of its own)."""
    return [{"targets": [e.address], "labels": target_labels(e)} for e in engines]


@dataclass(frozen=True)
class EngineView:
    """An engine and the runner the current snapshot would choose for it (None: its config is
    not stored or this build cannot read it; such an engine is never counted stale)."""

    engine: Engine
    expected_runner: str | None

    @property
    def stale(self) -> bool:
        """It runs another runner than the one a restart would give it."""
        return self.expected_runner is not None and self.expected_runner != self.engine.runner

    def to_json(self, now: dt.datetime) -> dict[str, Any]:
        e = self.engine
        return {
            "engine_id": e.engine_id,
            "deployment_id": e.deployment_id,
            "host": e.host,
            "address": e.address,
            "metrics_url": f"{e.scheme}://{e.address}{e.metrics_path}",
            "engine": e.engine,
            "vllm_version": e.vllm_version,
            "family": e.family,
            "stage": e.stage,
            "runner": e.runner,
            "mode": e.mode,
            "cohort": e.cohort,
            "expected_runner": self.expected_runner,
            "stale": self.stale,
            "started_at": e.started_at.isoformat(),
            "last_seen_at": e.last_seen_at.isoformat(),
            "last_seen_s_ago": max(0.0, round((now - e.last_seen_at).total_seconds(), 1)),
        }


def expected_runner(policy: Policy, engine: Engine, canaries: CanarySnapshot) -> str | None:
    """The runner ``engine``'s deployment gets under ``canaries`` (what a restart would run)."""
    if engine.config is None:
        return None
    spec = spec_with_id(engine.config, engine.deployment_id)
    config = spec_config(json.dumps(spec, sort_keys=True))
    if config is None:
        return None
    return policy.decide(config, canaries).runner


def engine_views(
    policy: Policy, engines: Sequence[Engine], canaries: CanarySnapshot
) -> list[EngineView]:
    """Every engine with the runner the snapshot ``canaries`` would give it."""
    return [EngineView(e, expected_runner(policy, e, canaries)) for e in engines]


def live_engines(
    services: Services, *, stage: str | None = None, deployment_id: str | None = None
) -> list[Engine]:
    """The live engines (``engine_ttl_s``), read in a read transaction and detached."""
    now = utcnow()
    with services.db.read_session() as session:
        rows = list(
            live(
                session=session,
                now=now,
                ttl=dt.timedelta(seconds=services.settings.engine_ttl_s),
                stage=stage,
            )
        )
        session.expunge_all()
    if deployment_id is not None:
        rows = [e for e in rows if e.deployment_id == deployment_id]
    return rows


def current_views(
    services: Services, *, stage: str | None = None, deployment_id: str | None = None
) -> list[EngineView]:
    """The live engines with the runner the current canary snapshot gives each."""
    rows = live_engines(services, stage=stage, deployment_id=deployment_id)
    return engine_views(services.policy, rows, services.policy.snapshot().canaries)


RESTART_NOTICE_KEY = "restart_required_etag"


def restart_notice(
    session: Session,
    policy: Policy,
    canaries: CanarySnapshot,
    etag: str,
    now: dt.datetime,
    ttl: dt.timedelta,
) -> list[EngineView] | None:
    """Once per canary state (its ``etag``): the live engines that run another runner than
    that state gives them, audited (``engines.restart_required``) and sent to the
    ``restart_required`` webhooks with their addresses. None when this state was handled
    already (by this replica or another: the etag is kept in ``service_meta`` under a row
    lock); the caller commits.
    """
    meta = session.get(ServiceMeta, RESTART_NOTICE_KEY, with_for_update=True)
    if meta is not None and meta.value == etag:
        return None
    if meta is None:
        session.add(ServiceMeta(key=RESTART_NOTICE_KEY, value=etag))
    else:
        meta.value = etag
    stale = [v for v in engine_views(policy, live(session=session, now=now, ttl=ttl), canaries)
             if v.stale]  # fmt: skip
    if stale:
        listed = [v.to_json(now) for v in stale]
        entry = audit.record(
            session=session,
            actor="service",
            action="engines.restart_required",
            target="fleet",
            reason=f"{len(stale)} live engines run another runner than the canary state "
            f"{etag} gives them; each takes it at its next start",
            before=None,
            after={"etag": etag, "engines": listed[:200], "num_engines": len(stale)},
            at=now,
        )
        webhooks.enqueue(
            session=session,
            kind=webhooks.Kind.restart_required,
            entry=entry,
            # bounded as the audit entry is: a fleet of thousands would make every
            # delivery megabytes; num_engines says how many there are
            extra={"engines": listed[:200], "num_engines": len(stale), "etag": etag},
        )
    return stale


__all__ = [
    "EngineView",
    "current_views",
    "engine_views",
    "expected_runner",
    "live_engines",
    "prometheus_targets",
    "restart_notice",
    "target_labels",
]
