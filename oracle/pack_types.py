"""The parts of a loaded pack that documentation, tooling and the service read: its rollout
stages (:class:`Cohort`) and its rules (:class:`RuleInfo`)."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cohort:
    """A rollout stage as the service shows and stores it (``id`` is the cohort key)."""

    id: str
    label: str
    enabled: bool
    percentage: int
    families: tuple[str, ...]
    when: Mapping[str, Any]
    description: str
    index: int


@dataclass(frozen=True)
class RuleInfo:
    """A rule as documentation and tooling see it."""

    id: str
    label: str
    effect: str
    severity: str
    prerequisite: bool
    when: Mapping[str, Any]
    reason: str
    reference: str

    def matched_label(self) -> str:
        """The label with each placeholder filled from the rule's own condition on that field
        ("speculative method '{speculative_method}'" with ``when: {speculative_method:
        draft_model}`` → "speculative method 'draft_model'"; a set of values reads
        "'ngram or ngram_gpu'"). For views that count a rule over many decisions, such as the
        fallback-reason ranking; a placeholder no ``eq``/``in`` condition fixes is dropped."""
        fields = {name for _, name, _, _ in string.Formatter().parse(self.label) if name}
        values = {f: _condition_text(self.when.get(f, ())) for f in fields}
        text = self.label
        for name, value in values.items():
            if value is None:  # drop it, with the quotes and the space before it
                text = re.sub(r"\s*'?\{" + re.escape(name) + r"\}'?", "", text)
            else:
                text = text.replace("{" + name + "}", value)
        return text.strip() or self.id


def _condition_text(ops: Any) -> str | None:
    """The value(s) an ``eq`` or ``in`` condition admits, as text; None for anything else."""
    for op, operand in ops:
        if op == "eq":
            return str(operand)
        if op == "in":
            return " or ".join(str(o) for o in operand)
    return None


__all__ = ["Cohort", "RuleInfo"]
