"""One deployment decided by two packs: what its runner does on the move from one release to
another (``v1→v2``, ``v2→refuse``, …) and why, on each side.

The vocabulary the upgrade previews share (``turnout matrix --diff``, ``turnout decide
--compare``, the service's upgrade preview and docs/oracle-releases.md):

- an *outcome* is ``v1``, ``v2`` or ``refuse`` (no runner: the engine does not start, the
  Decision's ``error`` says why);
- a *change* is ``"<before>→<after>"`` of two different outcomes, None when the runner stays;
- *why* is the ids of the Decision's reasons (rules, ``step.<id>`` for a step's refusal,
  ``pin.v1``/``pin.v2``, ``error.<code>``), or its reason code when it has none (``DEFAULT``:
  no rule decided), plus the ids of the steps that changed the configuration on one side only.

Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turnout.oracle.config import DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, Decision
from turnout.oracle.pack import Pack

REFUSE = "refuse"
ARROW = "→"
# The order reports list changes in: toward V2 first, then away from it, then refusals.
CHANGE_ORDER = ("v1→v2", "refuse→v2", "v2→v1", "refuse→v1", "v1→refuse", "v2→refuse")


def outcome(d: Decision) -> str:
    """``v1``, ``v2`` or ``refuse`` (runner None)."""
    return d.runner or REFUSE


def change_of(before: Decision, after: Decision) -> str | None:
    """``"v1→v2"`` … for two decisions whose runners differ; None when they agree."""
    a, b = outcome(before), outcome(after)
    return None if a == b else f"{a}{ARROW}{b}"


def change_rank(change: str) -> int:
    """Sort key of a change in :data:`CHANGE_ORDER` (unknown ones last)."""
    return CHANGE_ORDER.index(change) if change in CHANGE_ORDER else len(CHANGE_ORDER)


def why(d: Decision) -> list[str]:
    """The ids of the decision's reasons, or ``[reason_code]`` when it has none."""
    return [r.rule_id for r in d.reasons] or [str(d.reason_code)]


@dataclass(frozen=True)
class Side:
    """One pack's decision of a deployment, and the steps that applied under it alone."""

    pack: str
    decision: Decision
    only_steps: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        return outcome(self.decision)

    def why(self) -> list[str]:
        """:func:`why` plus ``step:<id>`` for each step that applied on this side only."""
        return why(self.decision) + [f"step:{s}" for s in self.only_steps]

    def to_json(self) -> dict[str, Any]:
        """``{pack, runner, reason_code, why, reasons: [{rule_id, label}], steps, error,
        error_code}`` (``steps``: ids of steps that applied under this pack only)."""
        d = self.decision
        return {
            "pack": self.pack,
            "runner": d.runner,
            "reason_code": d.reason_code,
            "why": why(d),
            "reasons": [{"rule_id": r.rule_id, "label": r.label} for r in d.reasons],
            "steps": list(self.only_steps),
            "error": d.error,
            "error_code": d.error_code,
        }


def set_steps(pack: Pack, config: DeploymentConfig) -> list[str]:
    """The ids of the pack's ``set`` steps that changed ``config`` before the decision."""
    kinds = {s.id: s.kind for s in pack.data.steps}
    return [s for s in pack.steps_applied(config) if kinds[s] == "set"]


def only_steps(
    before: Pack,
    after: Pack,
    config: DeploymentConfig,
    after_config: DeploymentConfig | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(``set`` steps that changed the config under ``before`` only, under ``after`` only), by
    id: a normalisation one release makes and the other does not (``enforce_eager`` turning
    compilation off, say) explains a change that no rule names. ``after_config``: the config
    ``after`` decides, when it differs (a matrix cell pins with each pack's own variable)."""
    a = set_steps(before, config)
    b = set_steps(after, after_config if after_config is not None else config)
    return (tuple(s for s in a if s not in b), tuple(s for s in b if s not in a))


def sides(
    before: Pack,
    after: Pack,
    config: DeploymentConfig,
    canaries: CanarySnapshot | None = None,
    *,
    steps: bool = True,
    after_config: DeploymentConfig | None = None,
) -> tuple[Side, Side]:
    """The deployment decided by both packs (``canaries`` apply to ``before`` only: a
    snapshot names one pack's cohorts; ``after`` decides with its rollout.yaml defaults).
    With ``steps``, when the runner changes and both start, each side names the ``set`` steps
    only it applied (a refusal stops the steps, and its reason says why). ``after_config``:
    what ``after`` decides when its release read the input differently (its own parser)."""
    later = after_config if after_config is not None else config
    a, b = before.decide(config, canaries), after.decide(later)
    explain = steps and a.runner != b.runner and a.runner and b.runner
    only = only_steps(before, after, config, later) if explain else ((), ())
    return Side(before.name, a, only[0]), Side(after.name, b, only[1])


@dataclass(frozen=True)
class DeploymentChange:
    """One deployment (a command line, a spec entry, a recorded deployment) under two packs;
    ``before``/``after`` are None for input that could not be read (``error`` says why)."""

    id: str | None
    model: str | None
    before: Side | None
    after: Side | None
    error: str | None = None
    error_code: str | None = None

    @property
    def change(self) -> str | None:
        if self.before is None or self.after is None:
            return None
        return change_of(self.before.decision, self.after.decision)

    @property
    def family(self) -> str | None:
        if self.before is None or self.after is None:
            return None
        return self.after.decision.family or self.before.decision.family

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "family": self.family,
            "change": self.change,
        }
        if self.before is None or self.after is None:
            return out | {"error": self.error, "error_code": self.error_code}
        return out | {"before": self.before.to_json(), "after": self.after.to_json()}


def count_changes(changes: Iterable[str | None]) -> dict[str, int]:
    """Change → how many, in :data:`CHANGE_ORDER` (None, "no change", is left out)."""
    counts = Counter(c for c in changes if c is not None)
    return dict(sorted(counts.items(), key=lambda kv: (change_rank(kv[0]), kv[0])))


def top(ids: Iterable[Sequence[str]], n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` most common ids over several ``why`` lists (each list counts an id once)."""
    counts: Counter[str] = Counter()
    for group in ids:
        counts.update(set(group))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


BAD_INPUT = "(bad input)"


@dataclass(frozen=True)
class FamilySummary:
    """One family's deployments under two packs: how many, how many change which way, and the
    most common reasons of the changed ones on each side ((id, deployments) pairs; for
    :data:`BAD_INPUT`, the error codes)."""

    family: str
    deployments: int
    changes: dict[str, int]
    why_before: list[tuple[str, int]]
    why_after: list[tuple[str, int]]

    @property
    def changed(self) -> int:
        return sum(self.changes.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "deployments": self.deployments,
            "changed": self.changed,
            "changes": self.changes,
            "why_before": dict(self.why_before),
            "why_after": dict(self.why_after),
        }


def by_family(changes: Iterable[DeploymentChange]) -> list[FamilySummary]:
    """Per family (:data:`BAD_INPUT` for unreadable input): most changed first, then most
    deployments, then by name."""
    groups: dict[str, list[DeploymentChange]] = {}
    for c in changes:
        fam = BAD_INPUT if c.before is None else c.family or "(none)"
        groups.setdefault(fam, []).append(c)
    out = []
    for fam, cs in groups.items():
        moved = [c for c in cs if c.change is not None]
        if fam == BAD_INPUT:
            errors = top(([c.error_code or "bad_input"] for c in cs), 3)
            out.append(FamilySummary(fam, len(cs), {}, errors, errors))
            continue
        out.append(
            FamilySummary(
                fam,
                len(cs),
                count_changes(c.change for c in moved),
                top((c.before.why() for c in moved if c.before), 3),
                top((c.after.why() for c in moved if c.after), 3),
            )
        )
    out.sort(key=lambda s: (s.family == BAD_INPUT, -s.changed, -s.deployments, s.family))
    return out
