"""What the Canaries and Overview pages show per rollout cohort, and the confirm form's
preview of a flip: the cohort's families (named by its stage, and seen in the fleet), the
latest parity evidence of each, whether the kill switch overrides its canary, and the impact
of the flip at the share typed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnout.dashboard.api.schemas import ImpactOut
from turnout.dashboard.impact import impact_of_flip
from turnout.dashboard.services import Services
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store import evidence, history
from turnout.dashboard.store.errors import NotFound
from turnout.dashboard.store.models import ParityEvidence
from turnout.oracle.errors import ErrorCode


@dataclass
class CohortRow:
    """One cohort as the pages show it."""

    cohort: str
    label: str
    enabled: bool
    percentage: int
    version: int
    updated_at: Any
    updated_by: str
    families: tuple[str, ...]  # named by the stage (empty: the stage selects by attributes)
    when: dict[str, Any]  # the stage's attribute conditions
    seen: list[tuple[str, int]]  # families of the fleet's deployments in this stage, most first
    evidence: list[ParityEvidence] = field(default_factory=list)
    overridden: bool = False  # enabled, but the kill switch sends every auto deployment to V1

    @property
    def failing(self) -> list[ParityEvidence]:
        return [e for e in self.evidence if e.result != "pass"]


def cohort_rows(services: Services) -> list[CohortRow]:
    """The canaries in rollout order, each with its families and their latest evidence."""
    policy = services.policy
    labels = policy.cohort_labels()
    stages = {c.id: c for c in policy.pack.cohorts}
    with services.db.read_session() as session:
        rows = canary_store.list_canaries(session=session)
        latest = evidence.latest_per_family(session=session)
        engaged = canary_store.get_kill_switch(session=session).engaged
        seen = history.families_by_stage(session=session)
    rows.sort(key=lambda c: (policy.rollout_position(c.cohort), c.cohort))
    out = []
    for c in rows:
        stage = stages.get(c.cohort)
        named = tuple(stage.families) if stage is not None else ()
        fleet = sorted(seen.get(c.cohort, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        families = named or tuple(f for f, _n in fleet)
        out.append(
            CohortRow(
                cohort=c.cohort,
                label=labels.get(c.cohort, c.cohort),
                enabled=c.enabled,
                percentage=c.percentage,
                version=c.version,
                updated_at=c.updated_at,
                updated_by=c.updated_by,
                families=named,
                when=dict(stage.when) if stage is not None else {},
                seen=fleet,
                evidence=[latest[f] for f in families if f in latest],
                overridden=c.enabled and engaged,
            )
        )
    return out


def describe_when(when: dict[str, Any]) -> str:
    """A stage's conditions in words: ``quantized, not MoE`` (``{quantized: true, is_moe:
    false}``)."""
    names = {"is_moe": "MoE", "attention_free": "attention-free"}
    parts = []
    for key, value in when.items():
        name = names.get(key, key.replace("_", " "))
        if value is True:
            parts.append(name)
        elif value is False:
            parts.append(f"not {name}")
        else:
            parts.append(f"{name} {value}")
    return ", ".join(parts)


@dataclass
class FlipPreview:
    """The confirm form's preview: the impact at ``share`` and what the form must warn of."""

    row: CohortRow
    enabled: bool
    share: int
    impact: ImpactOut
    kill_switch: bool

    @property
    def failing(self) -> list[ParityEvidence]:
        """Families whose latest parity run failed: enabling sends them to V2 regardless."""
        return self.row.failing if self.enabled else []


def flip_preview(services: Services, cohort: str, enabled: bool, share: int | None) -> FlipPreview:
    """Raises the store's NotFound for an unknown cohort (as impact_of_flip)."""
    impact = impact_of_flip(services, cohort, enabled, share if enabled else None)
    row = next((r for r in cohort_rows(services) if r.cohort == cohort), None)
    if row is None:  # removed between the two reads
        raise NotFound(f"unknown cohort {cohort!r}", code=ErrorCode.UNKNOWN_COHORT)
    with services.db.read_session() as session:
        engaged = canary_store.get_kill_switch(session=session).engaged
    return FlipPreview(
        row, enabled, share if share is not None else row.percentage, impact, engaged
    )
