"""The upgrade preview: every recorded deployment (its latest decision and the config it
reported, ``deployments``) decided again by two packs, for instance the vLLM release a fleet
runs and the next one, and per family what would switch runner and why.

A pack that is the service's own decides with the current canaries; any other with its
rollout.yaml defaults (the vLLM release packs have no stages). Only shipped pack names are
taken (never a folder: the name comes from a query string). No decision logic lives here: the
oracle's :mod:`oracle.compare` decides and explains both sides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from turnout.dashboard.impact import spec_config, spec_with_id
from turnout.dashboard.policy import closest
from turnout.dashboard.services import Services
from turnout.dashboard.store import aggregates
from turnout.oracle import OracleError, Pack, load_pack
from turnout.oracle.compare import DeploymentChange, FamilySummary, by_family, count_changes, sides
from turnout.oracle.errors import ErrorCode
from turnout.oracle.matrix_diff import unknown_fields
from turnout.oracle.paths import RELEASE_PACKS, SHIPPED_PACKS

MAX_EXAMPLES = 20  # deployments listed per family (the counts cover them all)


@dataclass(frozen=True)
class FamilyPreview:
    """A family's counts (:class:`oracle.compare.FamilySummary`), its label and up to
    :data:`MAX_EXAMPLES` of its deployments that would switch, most common change first."""

    summary: FamilySummary
    label: str
    examples: list[tuple[DeploymentChange, bool]]  # (the change, demo)


@dataclass(frozen=True)
class UpgradePreview:
    """Recorded deployments under ``from_pack`` and ``to_pack``.

    ``num_deployments``: every recorded deployment; ``num_without_config``: those whose
    engine reported no config, and ``num_unreadable``: those whose config this build cannot
    read (both left out); ``num_changed``: deployments that would change runner, by change
    in ``changes``; ``unknown_fields``: pack → fields its release lacks that the other has."""

    from_pack: str
    to_pack: str
    num_deployments: int
    num_without_config: int
    num_unreadable: int
    num_changed: int
    changes: dict[str, int]
    unknown_fields: dict[str, list[str]]
    families: list[FamilyPreview] = field(default_factory=list)

    @property
    def num_considered(self) -> int:
        return self.num_deployments - self.num_without_config - self.num_unreadable


def pack_names() -> list[str]:
    """The packs a preview may name: the release packs (newest first), then the others."""
    return [*reversed(RELEASE_PACKS), *(p for p in SHIPPED_PACKS if p not in RELEASE_PACKS)]


def default_packs(from_name: str | None, to_name: str | None) -> tuple[str, str]:
    """The packs of a preview with either name left out: ``to`` the newest release; ``from``
    the release before ``to`` (the oldest release when ``to`` is the oldest or no release)."""
    to = to_name or RELEASE_PACKS[-1]
    if from_name:
        return from_name, to
    if to in RELEASE_PACKS and RELEASE_PACKS.index(to) > 0:
        return RELEASE_PACKS[RELEASE_PACKS.index(to) - 1], to
    return RELEASE_PACKS[0], to


def resolve(name: str, what: str) -> Pack:
    """The shipped pack ``name``; OracleError (``unknown_pack``) naming the closest one and
    every pack a preview takes."""
    if name not in SHIPPED_PACKS:
        close = closest(name, SHIPPED_PACKS)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise OracleError(
            f"{what}: unknown pack {name!r}{hint}; the packs: {', '.join(pack_names())}",
            code=ErrorCode.UNKNOWN_PACK,
        )
    return load_pack(name)


def upgrade_preview(
    services: Services,
    from_name: str | None = None,
    to_name: str | None = None,
    *,
    include_demo: bool = True,
) -> UpgradePreview:
    """Every recorded deployment decided by both packs. Raises OracleError
    (``unknown_pack``) for a name that is not a shipped pack."""
    from_name, to_name = default_packs(from_name, to_name)
    before, after = resolve(from_name, "from"), resolve(to_name, "to")
    with services.db.read_session() as session:
        rows = aggregates.recorded_deployments(session=session, include_demo=include_demo)
    snap = services.policy.snapshot().canaries
    canaries = snap if before.name == services.policy.pack_name else None
    decided: list[tuple[DeploymentChange, bool]] = []
    no_config = unreadable = 0
    for row in rows:
        if row.config is None:
            no_config += 1
            continue
        config = spec_config(
            json.dumps(spec_with_id(row.config, row.deployment_id), sort_keys=True)
        )
        if config is None:
            unreadable += 1
            continue
        change = DeploymentChange(
            row.deployment_id, config.model, *sides(before, after, config, canaries)
        )
        decided.append((change, row.demo))
    moved = [c for c, _ in decided if c.change is not None]
    lacking = unknown_fields(before, after)
    return UpgradePreview(
        before.name,
        after.name,
        len(rows),
        no_config,
        unreadable,
        len(moved),
        count_changes(c.change for c in moved),
        {before.name: list(lacking[0]), after.name: list(lacking[1])},
        _families(decided, {**before.families, **after.families}),
    )


def _families(
    decided: list[tuple[DeploymentChange, bool]], labels: dict[str, str]
) -> list[FamilyPreview]:
    demo = {id(c): d for c, d in decided}
    changes = [c for c, _ in decided]
    out = []
    for summary in by_family(changes):
        moved = sorted(
            (c for c in changes if c.family == summary.family and c.change is not None),
            key=lambda c: (-summary.changes.get(c.change or "", 0), c.id or ""),
        )
        out.append(
            FamilyPreview(
                summary,
                labels.get(summary.family, summary.family),
                [(c, demo[id(c)]) for c in moved[:MAX_EXAMPLES]],
            )
        )
    return out


def preview_json(preview: UpgradePreview) -> dict[str, Any]:
    """The ``GET /api/v1/upgrade-preview`` body (dashboard.api.schemas.UpgradePreviewOut)."""
    return {
        "from_pack": preview.from_pack,
        "to_pack": preview.to_pack,
        "num_deployments": preview.num_deployments,
        "num_considered": preview.num_considered,
        "num_without_config": preview.num_without_config,
        "num_unreadable": preview.num_unreadable,
        "num_changed": preview.num_changed,
        "changes": preview.changes,
        "unknown_fields": preview.unknown_fields,
        "families": [
            {
                **f.summary.to_json(),
                "label": f.label,
                "examples": [_example(c, demo) for c, demo in f.examples],
            }
            for f in preview.families
        ],
    }


def _example(c: DeploymentChange, demo: bool) -> dict[str, Any]:
    assert c.before is not None and c.after is not None
    return {
        "deployment_id": c.id,
        "model": c.model,
        "change": c.change,
        "demo": demo,
        "before": c.before.to_json(),
        "after": c.after.to_json(),
    }
