"""Impact preview of a canary flip: every recorded deployment with a stored config is decided
by the oracle twice, under the current snapshot and under the hypothetical one."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from turnout.dashboard.api.schemas import ImpactOut
from turnout.dashboard.policy import to_snapshot
from turnout.dashboard.services import Services
from turnout.dashboard.store import aggregates
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store.errors import NotFound
from turnout.oracle import DeploymentConfig, OracleError, from_spec
from turnout.oracle.errors import ErrorCode


@lru_cache(maxsize=100_000)
def spec_config(spec_json: str) -> DeploymentConfig | None:
    """The config of a stored spec (JSON text, for the cache), None when this build cannot
    read it (a field it does not know, a value it refuses)."""
    import json

    try:
        return from_spec(json.loads(spec_json))
    except (OracleError, ValueError, TypeError):
        return None


def impact_of_flip(
    services: Services, cohort: str, enabled: bool, percentage: int | None = None
) -> ImpactOut:
    """Raises NotFound for an unknown cohort."""
    import json

    with services.db.read_session() as session:
        state = canary_store.read_state(session=session)
        if cohort not in state.cohorts:
            raise NotFound(f"unknown cohort {cohort!r}", code=ErrorCode.UNKNOWN_COHORT)
        rows = [
            (d.deployment_id, d.config) for d in aggregates.deployments_for_impact(session=session)
        ]
    _e, pct, version = state.cohorts[cohort]
    flipped = dict(state.cohorts)
    flipped[cohort] = (enabled, pct if percentage is None else percentage, version + 1)
    now = to_snapshot(state)
    then = to_snapshot(dataclasses.replace(state, cohorts=flipped))
    considered = to_v2 = to_v1 = 0
    examples: list[str] = []
    for deployment_id, spec in rows:
        config = spec_config(json.dumps(spec_with_id(spec, deployment_id), sort_keys=True))
        if config is None:
            continue
        considered += 1
        before = services.policy.decide(config, now).runner
        after = services.policy.decide(config, then).runner
        if before == after:
            continue
        to_v2 += after == "v2"
        to_v1 += after != "v2"
        if len(examples) < 20:
            examples.append(deployment_id)
    return ImpactOut(
        cohort=cohort,
        enabled=enabled,
        num_considered=considered,
        num_changed=to_v2 + to_v1,
        to_v2=to_v2,
        to_v1=to_v1,
        examples=examples,
    )


def spec_with_id(spec: dict[str, Any] | None, deployment_id: str) -> dict[str, Any]:
    """The spec with its deployment id (percentage canaries hash it)."""
    out = dict(spec or {})
    out.setdefault("deployment_id", deployment_id)
    return out
