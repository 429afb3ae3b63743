"""explain(): the smallest changes that would take a deployment to V2, each re-checked.

Candidates are the deployment options the deciding rules tested (model facts such as the
architecture or ``is_moe`` are not changeable), each tried with the other values of its closed
domain, alone, then in pairs and triples, keeping only sets with no smaller working subset.
Values that keep a feature on are preferred over turning it off (``ngram -> eagle3`` before
``ngram -> none``). Every suggestion carries the Decision its config really gets. When the
rollout decided, pinning V2 and enabling the stage's canary are offered too, re-checked the
same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from oracle.config import DeploymentConfig
from oracle.decision import CanarySnapshot, CohortState, Decision
from oracle.fields import FIELD_INFO
from oracle.pack import Pack

_OFF = ("none", False, 0, 0.0, ())
MAX_CHANGES = 3


@dataclass(frozen=True)
class Change:
    """One edit: ``dimension`` from ``old`` to ``new`` (``env:NAME`` for a runner variable,
    ``canary:STAGE`` for an operator's canary flip)."""

    dimension: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.dimension} {_show(self.old)} → {_show(self.new)}"


@dataclass(frozen=True)
class Suggestion:
    """A set of changes and the decision they reach (always runner "v2")."""

    changes: tuple[Change, ...]
    decision: Decision
    kind: str  # "config" | "pin" | "canary"

    def __str__(self) -> str:
        return "; ".join(str(c) for c in self.changes)


@dataclass(frozen=True)
class Explanation:
    """The decision, and the smallest changes that reach V2 (empty when already V2)."""

    decision: Decision
    suggestions: tuple[Suggestion, ...]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision.to_json(), "note": self.note or None,
                "suggestions": [{"kind": s.kind, "text": str(s),
                                 "changes": [{"dimension": c.dimension, "from": _plain(c.old),
                                              "to": _plain(c.new)} for c in s.changes],
                                 "reason_code": s.decision.reason_code}
                                for s in self.suggestions]}


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _show(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, tuple):
        return "[" + ", ".join(v) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


def _alternatives(pack: Pack, dim: str, current: Any) -> list[Any]:
    domain = pack.domains.get(dim) or ()
    values = [v for v in domain if v != current]
    return [v for v in values if v not in _OFF] + [v for v in values if v in _OFF]


def _candidate_dims(pack: Pack, decision: Decision) -> list[str]:
    dims: list[str] = []
    for reason in decision.reasons:
        for dim in reason.matched:
            info = FIELD_INFO.get(dim)
            if info is not None and info.changeable and dim in pack.domains and dim not in dims:
                dims.append(dim)
    return dims


def _reaches_v2(d: Decision) -> bool:
    return d.runner == "v2"


def _config_suggestions(config: DeploymentConfig, pack: Pack, dims: Sequence[str],
                        canaries: CanarySnapshot | None) -> list[Suggestion]:
    found: list[Suggestion] = []
    solved: list[frozenset[str]] = []
    for size in range(1, min(MAX_CHANGES, len(dims)) + 1):
        for combo in itertools.combinations(dims, size):
            if any(s <= frozenset(combo) for s in solved):
                continue
            hit = _first_working(config, pack, combo, canaries)
            if hit is not None:
                found.append(hit)
                solved.append(frozenset(combo))
    return found


def _first_working(config: DeploymentConfig, pack: Pack, combo: Iterable[str],
                   canaries: CanarySnapshot | None) -> Suggestion | None:
    dims = list(combo)
    choices = [_alternatives(pack, d, getattr(config, d)) for d in dims]
    for values in itertools.product(*choices):
        candidate = config.replace(**dict(zip(dims, values, strict=True)))
        d = pack.decide(candidate, canaries)
        if _reaches_v2(d):
            changes = tuple(Change(dim, getattr(config, dim), v)
                            for dim, v in zip(dims, values, strict=True))
            return Suggestion(changes, d, "config")
    return None


def _rollout_suggestions(config: DeploymentConfig, pack: Pack, decision: Decision,
                         canaries: CanarySnapshot | None) -> list[Suggestion]:
    out: list[Suggestion] = []
    if decision.mode == "auto":
        pinned = config.replace(env={**config.env, **pack.pin_env("v2")})
        d = pack.decide(pinned, canaries)
        if _reaches_v2(d):
            out.append(Suggestion((Change(f"env:{pack.env_var}", None, "1"),), d, "pin"))
    if decision.stage is not None and any(r.rule_id.startswith("rollout.")
                                          for r in decision.reasons):
        cohorts = dict(canaries.cohorts) if canaries else {}
        old = cohorts.get(decision.stage)
        cohorts[decision.stage] = CohortState(True, 100)
        snap = CanarySnapshot(cohorts, kill_switch=False)
        d = pack.decide(config, snap)
        if _reaches_v2(d):
            before = "off" if old is None or not old.enabled else f"{old.percentage}%"
            if canaries is not None and canaries.kill_switch:
                before += " (kill switch on)"
            out.append(Suggestion((Change(f"canary:{decision.stage}", before, "on 100%"),), d,
                                  "canary"))
    return out


def explain(config: DeploymentConfig, *, pack: Pack,
            canaries: CanarySnapshot | None = None) -> Explanation:
    """The decision for ``config`` and the smallest changes that reach V2, each re-checked by
    deciding again. Pure; never raises for bad deployment facts (like :func:`decide`)."""
    decision = pack.decide(config, canaries)
    if decision.runner == "v2":
        return Explanation(decision, (), "already V2")
    if decision.error_code in ("unknown_architecture", "invalid_env"):
        return Explanation(decision, (), "fix the input first: " + (decision.error or ""))
    dims = _candidate_dims(pack, decision)
    suggestions = _config_suggestions(config, pack, dims, canaries)
    suggestions += _rollout_suggestions(config, pack, decision, canaries)
    note = "" if suggestions else "no change of the deployment's options reaches V2"
    return Explanation(decision, tuple(suggestions), note)
