"""What ``POST /api/v1/health`` checks of a batch of health reports, report by report.

The batch itself must be ``{"reports": [...]}`` with 1 to 5,000 items (else the request is a
422 ``invalid_request``, nothing stored). Each item is then checked alone, and a bad one is
refused alone, named in the answer with the API's error shape (``{"code", "message"}``) while
the others are stored: a report is a measurement of one engine's window, and one engine's
malformed report must not cost the others theirs. An item is refused when it does not validate
(``oracle.wire.HealthReportIn``: ``invalid_request``), names another pack (``wrong_pack``), a
family or stage its pack does not have (``unknown_family``, ``unknown_stage``), a window ending
beyond the allowed clock skew or before 2020 (``event_in_future``, ``event_too_old``), or holds a
NUL character, which PostgreSQL cannot store (``unstorable_value``; refused on SQLite too, so
that both backends take the same reports).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from turnout.dashboard.echo import clip
from turnout.dashboard.errors import MAX_MESSAGE_CHARS, invalid_request_message
from turnout.dashboard.event_checks import EARLIEST_EVENT
from turnout.dashboard.policy import Policy, closest
from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import (
    MAX_REPORTS_PER_BATCH,
    UNKNOWN_FAMILY,
    ErrorDetail,
    HealthRejected,
    HealthReportIn,
)

_REPORT = TypeAdapter(HealthReportIn)


class HealthEnvelope(BaseModel):
    """The batch as the route first reads it: its items are checked one by one."""

    model_config = ConfigDict(extra="forbid")

    reports: list[Any] = Field(min_length=1, max_length=MAX_REPORTS_PER_BATCH)


@dataclass
class CheckedBatch:
    reports: list[HealthReportIn]  # the items to store, in batch order
    rejected: list[HealthRejected]
    ids: list[str]  # every item's report id as sent ("" where it has none): the batch digest


def check_batch(
    items: Sequence[Any], policy: Policy, *, max_skew_s: float, now: dt.datetime | None = None
) -> CheckedBatch:
    """Each item of a batch validated and checked against ``policy``'s pack."""
    now = now or dt.datetime.now(dt.UTC)
    out = CheckedBatch([], [], [])
    for i, item in enumerate(items):
        rid = item.get("report_id") if isinstance(item, dict) else None
        out.ids.append(rid if isinstance(rid, str) else "")
        report, problem = _check(i, item, policy, max_skew_s, now)
        if problem is None and report is not None:
            out.reports.append(report)
        else:
            code, message = problem or (ErrorCode.INVALID_REQUEST, "not a report")
            out.rejected.append(
                HealthRejected(
                    index=i,
                    report_id=clip(rid) if isinstance(rid, str) else None,
                    detail=ErrorDetail(code=str(code), message=clip(message, MAX_MESSAGE_CHARS)),
                )
            )
    return out


def _check(
    i: int, item: Any, policy: Policy, max_skew_s: float, now: dt.datetime
) -> tuple[HealthReportIn | None, tuple[str, str] | None]:
    try:
        report = _REPORT.validate_python(item)
    except ValidationError as err:
        errors = [
            dict(e) | {"loc": ("body", "reports", i, *e["loc"])}
            for e in err.errors(include_url=False)
        ]
        return None, (ErrorCode.INVALID_REQUEST, invalid_request_message(errors))
    return report, _pack_problem(i, report, policy, max_skew_s, now)


def _pack_problem(
    i: int, r: HealthReportIn, policy: Policy, max_skew_s: float, now: dt.datetime
) -> tuple[str, str] | None:
    where = f"body field reports[{i}]"
    pack = policy.pack
    if r.pack not in (pack.name, policy.pack_name):
        return "wrong_pack", (
            f"{where}.pack: {clip(r.pack)!r} is not the pack this service runs ({pack.name!r})"
        )
    if r.family not in pack.families and r.family != UNKNOWN_FAMILY:
        return (
            ErrorCode.UNKNOWN_FAMILY,
            f"{where}.family: {policy.unknown_family_message(r.family)}",
        )
    stages = [c.id for c in pack.cohorts]
    if r.stage is not None and r.stage not in stages:
        close = closest(r.stage, stages)
        hint = f" (did you mean {close!r}?)" if close else ""
        return "unknown_stage", (
            f"{where}.stage: unknown stage {clip(r.stage)!r}{hint}; the "
            f"stages of pack {pack.name}: {', '.join(stages)}"
        )
    if r.window_start < EARLIEST_EVENT:
        return "event_too_old", f"{where}.window_start: {r.window_start.isoformat()} is before 2020"
    ahead = (r.window_end - now).total_seconds()
    if ahead > max_skew_s:
        return "event_in_future", (
            f"{where}.window_end: {r.window_end.isoformat()} is "
            f"{ahead:.0f} s ahead of the service's clock; at most "
            f"{max_skew_s:.0f} s are taken (TURNOUT_MAX_CLOCK_SKEW_S): "
            "check the engine host's clock"
        )
    if any(
        "\x00" in v for v in (r.report_id, r.deployment_id, r.host, r.pack, r.family, r.stage or "")
    ):
        return ErrorCode.UNSTORABLE_VALUE, f"{where}: a NUL character cannot be stored"
    return None
