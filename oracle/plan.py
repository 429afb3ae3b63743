"""Decision plans: a resolution's outcome with the config's values left as references.

The resolution order (oracle.policy) depends on which rules matched, the pin, the family, the
stage and the canary state - not on the values the rules matched (``tensor_parallel_size=8``
or ``=2``). It runs once per such shape and records a :class:`Plan` whose reasons, messages
and error refer to matched rules by index; :func:`instantiate` fills them in with the rule
facts of a concrete config. A cold decision of a known shape therefore costs one generated
``evaluate`` call plus a few tuple builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from turnout.oracle.compile_types import Template
from turnout.oracle.decision import CanaryOutcome, Decision, Message, Reason
from turnout.oracle.errors import ErrorCode

# Per matched rule: (its Reason, its rendered label, its values by dimension).
Facts = Mapping[int, tuple[Reason, str, dict[str, Any]]]


class Labels(NamedTuple):
    """A placeholder value: the comma-joined labels of the rules in ``mask`` (bit order)."""

    mask: int


class Text(NamedTuple):
    """A message or error text: a template, its arguments (values may be Labels), and the
    matched rule whose values also fill it (or -1)."""

    template: Template
    args: tuple[tuple[str, Any], ...]
    rule: int = -1

    def render(self, facts: Facts) -> str:
        values: dict[str, Any] = dict(facts[self.rule][2]) if self.rule >= 0 else {}
        for key, value in self.args:
            values[key] = labels(value.mask, facts) if isinstance(value, Labels) else value
        return self.template.render(values)


class Plan(NamedTuple):
    """Everything of a Decision except what the matched values fill in."""

    runner: str | None
    mode: str
    family: str
    stage: str | None
    canary: CanaryOutcome | None
    reasons: tuple[int | Reason, ...]  # rule index (its Reason from the facts) or a fixed Reason
    messages: tuple[Text, ...]
    reason_code: str
    error: tuple[Text, ...] | None  # parts joined with a space
    policy_digest: str
    error_code: ErrorCode | None
    pack: str


def bits(mask: int) -> list[int]:
    """The set bit positions of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def labels(mask: int, facts: Facts) -> str:
    return ", ".join(facts[i][1] for i in bits(mask))


def instantiate(plan: Plan, facts: Facts) -> Decision:
    """The Decision a plan gives for a config whose matched rules have these facts."""
    reasons = tuple(facts[r][0] if isinstance(r, int) else r for r in plan.reasons)
    messages = tuple(Message(t.template.level, t.render(facts)) for t in plan.messages)
    error = " ".join(t.render(facts) for t in plan.error) if plan.error is not None else None
    return Decision(
        plan.runner,  # type: ignore[arg-type]
        plan.mode,  # type: ignore[arg-type]
        plan.family,
        plan.stage,
        plan.canary,
        reasons,
        messages,
        plan.reason_code,  # type: ignore[arg-type]
        error,
        plan.policy_digest,
        plan.error_code,
        plan.pack,
    )
