"""The decision filters of the Decisions page and its CSV export (one set of query parameters
for both, so an export holds what the page listed)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated

from fastapi import Depends, Query

from turnout.dashboard.store.history import EventFilter
from turnout.dashboard.window import TimeWindow

REASON_CODES = ("STATIC", "TARGETING_MATCH", "SPLIT", "DISABLED", "DEFAULT", "ERROR")


@dataclass(frozen=True)
class DecisionFilters:
    """The filters as typed (empty: any)."""

    family: str = ""
    runner: str = ""
    reason_code: str = ""
    rule_id: str = ""
    deployment_id: str = ""

    def query(self) -> dict[str, str]:
        """The non-empty filters, for links."""
        return {k: v for k, v in asdict(self).items() if v}

    def where(self, window: TimeWindow) -> EventFilter:
        return EventFilter(
            family=self.family or None,
            runner=self.runner or None,
            reason_code=self.reason_code or None,
            rule_id=self.rule_id or None,
            deployment_id=self.deployment_id or None,
            start=window.start,
            end=window.end,
        )


def decision_filters(
    family: Annotated[str, Query(max_length=64)] = "",
    runner: Annotated[str, Query(pattern="^(|v1|v2|none)$")] = "",
    reason_code: Annotated[str, Query(pattern="^(|" + "|".join(REASON_CODES) + ")$")] = "",
    rule_id: Annotated[str, Query(max_length=128)] = "",
    deployment_id: Annotated[str, Query(max_length=256)] = "",
) -> DecisionFilters:
    return DecisionFilters(family, runner, reason_code, rule_id, deployment_id)


FiltersDep = Annotated[DecisionFilters, Depends(decision_filters)]
