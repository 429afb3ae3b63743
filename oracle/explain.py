"""explain(): the smallest changes that would take a deployment to V2, each re-checked.

Candidates are the deployment options the deciding rules tested (model facts such as the
architecture or ``is_moe`` are not changeable), each tried with the other values of its closed
domain, alone, then in pairs and triples, keeping only sets with no smaller working subset.
Values that keep a feature on are preferred over turning it off (``ngram -> eagle3`` before
``ngram -> none``). Every suggestion carries the Decision its config really gets. When the
rollout decided, pinning V2 and enabling the stage's canary are offered too, re-checked the
same way. When neither a config change alone nor a pin or canary step alone reaches V2 (a
blocker in a stage that is not enabled yet), the config change is offered together with the
step it needs (kinds ``config+pin`` and ``config+canary``), again only when no smaller set
works.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turnout.oracle.config import FIELD_INFO, DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, CohortState, Decision
from turnout.oracle.errors import ErrorCode
from turnout.oracle.pack import Pack

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
    kind: str  # "config" | "pin" | "canary" | "config+pin" | "config+canary"

    def __str__(self) -> str:
        return "; ".join(str(c) for c in self.changes)


@dataclass(frozen=True)
class Explanation:
    """The decision, and the smallest changes that reach V2 (empty when already V2)."""

    decision: Decision
    suggestions: tuple[Suggestion, ...]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision.to_json(),
            "note": self.note or None,
            "suggestions": [
                {
                    "kind": s.kind,
                    "text": str(s),
                    "changes": [
                        {"dimension": c.dimension, "from": _plain(c.old), "to": _plain(c.new)}
                        for c in s.changes
                    ],
                    "reason_code": s.decision.reason_code,
                }
                for s in self.suggestions
            ],
        }


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


def _candidate_dims(
    pack: Pack, config: DeploymentConfig, decision: Decision, canaries: CanarySnapshot | None
) -> list[str]:
    """The changeable options the deciding rules tested, then those of rules they hide: a
    prerequisite (Triton) decides before the blockers, which show only once it is met. Pinning
    V2 names every hard rule that holds; deciding again after each single change of a known
    option shows the soft ones."""
    dims = _reason_dims(pack, decision, [])
    pinned = config.replace(env={**config.env, **pack.pin_env("v2")})
    _reason_dims(pack, pack.decide(pinned, canaries), dims)
    for dim in list(dims):
        for value in _alternatives(pack, dim, getattr(config, dim)):
            _reason_dims(pack, pack.decide(config.replace(**{dim: value}), canaries), dims)
    return dims


def _reason_dims(pack: Pack, decision: Decision, dims: list[str]) -> list[str]:
    """``dims`` with the changeable options ``decision``'s reasons tested appended."""
    for reason in decision.reasons:
        for dim in reason.matched:
            info = FIELD_INFO.get(dim)
            if info is not None and info.changeable and dim in pack.domains and dim not in dims:
                dims.append(dim)
    return dims


def _reaches_v2(d: Decision) -> bool:
    return d.runner == "v2"


# A step after config changes: (candidate config, its decision) -> the step's changes and the
# decision they reach, or None when the step does not apply or does not reach V2.
Step = Callable[[DeploymentConfig, Decision], "tuple[tuple[Change, ...], Decision] | None"]


def _config_suggestions(
    config: DeploymentConfig,
    pack: Pack,
    dims: Sequence[str],
    canaries: CanarySnapshot | None,
    steps: dict[str, Step],
) -> list[Suggestion]:
    """Config changes alone, then (where those do not suffice) with each of ``steps``; a set
    is kept only if no subset of it worked alone or with the same step."""
    found: list[Suggestion] = []
    solved: dict[str, list[frozenset[str]]] = {"config": [], **{f"config+{k}": [] for k in steps}}
    for size in range(1, min(MAX_CHANGES, len(dims)) + 1):
        for combo in itertools.combinations(dims, size):
            key = frozenset(combo)
            if any(s <= key for s in solved["config"]):
                continue
            open_steps = {
                k: step
                for k, step in steps.items()
                if not any(s <= key for s in solved[f"config+{k}"])
            }
            for hit in _first_working(config, pack, combo, canaries, open_steps):
                found.append(hit)
                solved[hit.kind].append(key)
    return found


def _first_working(
    config: DeploymentConfig,
    pack: Pack,
    combo: Iterable[str],
    canaries: CanarySnapshot | None,
    steps: dict[str, Step],
) -> list[Suggestion]:
    """The first values of ``combo`` that reach V2 alone (one suggestion); failing that, for
    each step the first values that reach V2 with it."""
    dims = list(combo)
    choices = [_alternatives(pack, d, getattr(config, d)) for d in dims]
    with_step: dict[str, Suggestion] = {}
    for values in itertools.product(*choices):
        candidate = config.replace(**dict(zip(dims, values, strict=True)))
        changes = tuple(
            Change(dim, getattr(config, dim), v) for dim, v in zip(dims, values, strict=True)
        )
        d = pack.decide(candidate, canaries)
        if _reaches_v2(d):
            return [Suggestion(changes, d, "config")]
        for name, step in steps.items():
            if name in with_step:
                continue
            done = step(candidate, d)
            if done is not None:
                with_step[name] = Suggestion((*changes, *done[0]), done[1], "config+" + name)
    return [with_step[k] for k in steps if k in with_step]


def _pin_step(pack: Pack, canaries: CanarySnapshot | None, own: str | None) -> Step:
    """Pinning V2 after config changes (``own``: the deployment's own value of the runner
    variable, the change's starting point)."""

    def step(
        candidate: DeploymentConfig, _d: Decision
    ) -> tuple[tuple[Change, ...], Decision] | None:
        d = pack.decide(candidate.replace(env={**candidate.env, **pack.pin_env("v2")}), canaries)
        return ((Change(f"env:{pack.env_var}", own, "1"),), d) if _reaches_v2(d) else None

    return step


def _canary_step(pack: Pack, canaries: CanarySnapshot | None) -> Step:
    """The operator's flips after config changes, when only the rollout keeps the changed
    config on V1 (its stage may differ from the deployment's: a quantization change moves it)."""

    def step(
        candidate: DeploymentConfig, d: Decision
    ) -> tuple[tuple[Change, ...], Decision] | None:
        if (
            d.stage is None
            or not d.reasons
            or not all(r.rule_id.startswith("rollout.") for r in d.reasons)
        ):
            return None
        hit = _canary_suggestion(candidate, pack, d.stage, canaries)
        return None if hit is None else (hit.changes, hit.decision)

    return step


def _pin_suggestion(
    config: DeploymentConfig, pack: Pack, canaries: CanarySnapshot | None
) -> list[Suggestion]:
    """Pinning V2 with the pack's runner variable (from unset, or from a V1 pin)."""
    own = config.env.get(pack.env_var)
    if own == "1":
        return []
    d = pack.decide(config.replace(env={**config.env, **pack.pin_env("v2")}), canaries)
    return (
        [Suggestion((Change(f"env:{pack.env_var}", own, "1"),), d, "pin")] if _reaches_v2(d) else []
    )


def _rollout_suggestions(
    config: DeploymentConfig, pack: Pack, decision: Decision, canaries: CanarySnapshot | None
) -> list[Suggestion]:
    if decision.stage is None or not any(
        r.rule_id.startswith("rollout.") for r in decision.reasons
    ):
        return []
    canary = _canary_suggestion(config, pack, decision.stage, canaries)
    return [] if canary is None else [canary]


def _canary_suggestion(
    config: DeploymentConfig, pack: Pack, stage: str, canaries: CanarySnapshot | None
) -> Suggestion | None:
    """The operator's flips that take the deployment's stage to V2: releasing the kill switch
    if it is engaged, and the stage's canary on at 100% if it is not already."""
    default = next(c for c in pack.cohorts if c.id == stage)
    cohorts = dict(canaries.cohorts) if canaries else {}
    old = cohorts.get(stage, CohortState(default.enabled, default.percentage))
    killed = canaries.kill_switch if canaries is not None else pack.kill_switch
    changes = []
    if killed:
        changes.append(Change("kill_switch", "engaged", "released"))
    if not (old.enabled and old.percentage == 100):
        before = f"{old.percentage}%" if old.enabled else "off"
        changes.append(Change(f"canary:{stage}", before, "on 100%"))
    cohorts[stage] = CohortState(True, 100)
    d = pack.decide(config, CanarySnapshot(cohorts, kill_switch=False))
    return Suggestion(tuple(changes), d, "canary") if changes and _reaches_v2(d) else None


def _unpinned(
    config: DeploymentConfig, pack: Pack, decision: Decision
) -> tuple[DeploymentConfig, tuple[Change, ...]]:
    """For a deployment pinned to V1: the config without the pin, and the change that lifts
    it (every other suggestion needs it first). Otherwise the config unchanged, no change."""
    if not (decision.mode == "pinned" and decision.runner == "v1"):
        return config, ()
    env = {k: v for k, v in config.env.items() if k != pack.env_var}
    return config.replace(env=env), (Change(f"env:{pack.env_var}", config.env[pack.env_var], None),)


def explain(
    config: DeploymentConfig, *, pack: Pack, canaries: CanarySnapshot | None = None
) -> Explanation:
    """The decision for ``config`` and the smallest changes that reach V2, each re-checked by
    deciding again. Pure; never raises for bad deployment facts (like :func:`decide`)."""
    decision = pack.decide(config, canaries)
    if decision.runner == "v2":
        return Explanation(decision, (), "already V2")
    if decision.error_code in (ErrorCode.UNKNOWN_ARCHITECTURE, ErrorCode.INVALID_ENV):
        return Explanation(decision, (), "fix the input first: " + (decision.error or ""))
    if decision.error_code == ErrorCode.ARCHITECTURE_NOT_SERVED:  # the model is not an option
        return Explanation(
            decision,
            (),
            "no change of the deployment's options reaches a runner: " + (decision.error or ""),
        )
    base, unpin = _unpinned(config, pack, decision)
    why = pack.decide(base, canaries) if unpin else decision
    pin = _pin_suggestion(config, pack, canaries)
    rollout = _rollout_suggestions(base, pack, why, canaries)
    steps: dict[str, Step] = {}
    if not pin and config.env.get(pack.env_var) != "1":
        steps["pin"] = _pin_step(pack, canaries, config.env.get(pack.env_var))
    if not rollout:
        steps["canary"] = _canary_step(pack, canaries)
    dims = _candidate_dims(pack, base, why, canaries)
    found = _config_suggestions(base, pack, dims, canaries, steps)
    config_only = [sg for sg in found if sg.kind == "config"]
    combined = [sg for sg in found if sg.kind != "config"]
    # A config+pin suggestion pins from the deployment's own value (0 → 1): no lifting first.
    suggestions = [
        *_after(unpin, config_only),
        *pin,
        *_after(unpin, rollout),
        *[sg for sg in combined if sg.kind == "config+pin"],
        *_after(unpin, [sg for sg in combined if sg.kind == "config+canary"]),
    ]
    note = "" if suggestions else "no change of the deployment's options reaches V2"
    return Explanation(decision, tuple(suggestions), note)


def _after(unpin: tuple[Change, ...], suggestions: Iterable[Suggestion]) -> list[Suggestion]:
    """``suggestions`` starting with lifting a V1 pin (when there is one to lift)."""
    return [Suggestion((*unpin, *sg.changes), sg.decision, sg.kind) for sg in suggestions]
