"""The values the policy engine returns and takes: Decision, its parts, canary snapshots."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from turnout.oracle.errors import ErrorCode

RunnerName = Literal["v1", "v2"]
ReasonCode = Literal["STATIC", "TARGETING_MATCH", "SPLIT", "DISABLED", "DEFAULT", "ERROR"]


class Message(NamedTuple):
    """One log line in vLLM's shape; ``level`` is "INFO" or "WARNING"."""

    level: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "message": self.message}


class Reason(NamedTuple):
    """Why the decision went the way it did: a rule (or a rollout step) and what matched.

    ``rule_id`` is stable (rules keep their ids across pack versions; rollout steps use
    ``rollout.*`` and pins ``pin.*``); ``matched`` maps each dimension the rule tested to the
    config's value; ``effect`` is e.g. ``blocks_v2``; ``severity`` is "hard" or "soft".
    """

    rule_id: str
    label: str
    severity: str
    effect: str
    matched: Mapping[str, Any]
    reference: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "label": self.label,
            "severity": self.severity,
            "effect": self.effect,
            "matched": {k: _plain(v) for k, v in self.matched.items()},
            "reference": self.reference or None,
        }


class CanaryOutcome(NamedTuple):
    """The canary that applied: its cohort, state, and whether this deployment is in it."""

    cohort: str
    enabled: bool
    percentage: int
    included: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "cohort": self.cohort,
            "enabled": self.enabled,
            "percentage": self.percentage,
            "included": self.included,
        }


class Decision(NamedTuple):
    """The oracle's answer for one deployment (docs/architecture.md §3.4), shipped to every process.

    An immutable named tuple (cheap to build: a cold decision costs microseconds).

    ``runner`` is None when no runner can honour the config (a pin with hard blockers, a
    config neither runner serves, an architecture no runner of the build loads, an invalid
    runner variable); ``error`` then says why. An unknown architecture gives ``runner="v1"``,
    ``reason_code="ERROR"`` and ``error`` set. ``error_code`` is None or an
    :class:`~oracle.errors.ErrorCode` of area ``"decision"``: ``PIN_CONFLICT``, ``NO_RUNNER``,
    ``INVALID_ENV``, ``UNKNOWN_ARCHITECTURE``, ``ARCHITECTURE_NOT_SERVED``.
    """

    runner: RunnerName | None
    mode: Literal["auto", "pinned"]
    family: str | None
    stage: str | None
    canary: CanaryOutcome | None
    reasons: tuple[Reason, ...]
    messages: tuple[Message, ...]
    reason_code: ReasonCode
    error: str | None
    policy_digest: str
    error_code: ErrorCode | None = None
    pack: str = ""

    def to_json(self) -> dict[str, Any]:
        """The machine-readable object of the oracle contract (docs/oracle-api.md §JSON)."""
        return {
            "runner": self.runner,
            "mode": self.mode,
            "family": self.family,
            "stage": self.stage,
            "canary": self.canary.to_json() if self.canary else None,
            "reasons": [r.to_json() for r in self.reasons],
            "messages": [m.to_json() for m in self.messages],
            "reason_code": self.reason_code,
            "error": self.error,
            "error_code": self.error_code,
            "policy_digest": self.policy_digest,
            "pack": self.pack,
        }


@dataclass(frozen=True, slots=True)
class CohortState:
    """A cohort's canary: on or off, and the share of its deployments (0-100) that get V2."""

    enabled: bool
    percentage: int = 100

    def __post_init__(self) -> None:
        if (
            isinstance(self.percentage, bool)
            or not isinstance(self.percentage, int)
            or not 0 <= self.percentage <= 100
        ):
            raise ValueError(f"percentage must be an integer 0..100, got {self.percentage!r}")


@dataclass(frozen=True)
class CanarySnapshot:
    """The service's canary state: one CohortState per cohort id, and the kill switch.

    Cohorts missing from the snapshot keep the pack's default from rollout.yaml. Hashable and
    immutable, so decisions can be cached per snapshot.
    """

    cohorts: Mapping[str, CohortState] = field(default_factory=dict)
    kill_switch: bool = False
    _items: tuple[tuple[str, CohortState], ...] = field(
        init=False, repr=False, compare=False, default=()
    )
    digest: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        items = tuple(sorted(dict(self.cohorts).items()))
        for key, state in items:
            if not isinstance(state, CohortState):
                raise TypeError(f"cohort {key!r}: expected CohortState, got {state!r}")
        object.__setattr__(self, "cohorts", dict(items))
        object.__setattr__(self, "_items", items)
        body = json.dumps([self.kill_switch, [[k, s.enabled, s.percentage] for k, s in items]])
        object.__setattr__(self, "digest", hashlib.sha256(body.encode()).hexdigest()[:16])

    def __hash__(self) -> int:
        return hash((self._items, self.kill_switch))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CanarySnapshot)
            and self._items == other._items
            and self.kill_switch == other.kill_switch
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kill_switch": self.kill_switch,
            "cohorts": {
                k: {"enabled": s.enabled, "percentage": s.percentage} for k, s in self._items
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CanarySnapshot:
        """Inverse of :meth:`to_json`. Raises ValueError/TypeError on a malformed object;
        types are checked, not coerced (``"false"`` is not a boolean)."""
        cohorts = {}
        for k, v in dict(data.get("cohorts", {})).items():
            enabled, percentage = v["enabled"], v.get("percentage", 100)
            if not isinstance(enabled, bool):
                raise TypeError(f"cohort {k!r}: enabled must be true or false, got {enabled!r}")
            cohorts[str(k)] = CohortState(enabled, percentage)  # checks the percentage
        kill_switch = data.get("kill_switch", False)
        if not isinstance(kill_switch, bool):
            raise TypeError(f"kill_switch must be true or false, got {kill_switch!r}")
        return cls(cohorts, kill_switch=kill_switch)


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v
