"""The fallback-reasons view, shared by ``GET /api/v1/fallbacks`` and the ``/fallbacks`` page:
the filters checked against the pack, the report (``store.aggregates.fallbacks``) with the
labels of its reasons, and the page's charts, one pair per kind of reason.

Kinds (``store.latest_counts.reason_kind``): *blocked by a feature* (a rule of the pack that
V2 does not serve yet: a real incompatibility), *waiting for its stage* (the rollout stage is
off, or the deployment is outside its canary share), *held by an operator* (the kill switch, a
V1 pin). They are charted apart so that a stage that is simply off does not drown the rest.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from turnout.dashboard.policy import closest
from turnout.dashboard.services import Services
from turnout.dashboard.store import aggregates
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store.aggregates import EnabledSince, FallbackReport, FleetFilter
from turnout.dashboard.store.latest_counts import KINDS, reason_kind

KIND_TITLES = {
    "blocked": "Blocked by a feature",
    "waiting": "Waiting for its stage",
    "held": "Held by an operator",
}
KIND_NOTES = {
    "blocked": "a rule of the pack that V2 does not serve yet: a real incompatibility",
    "waiting": "\u201cnot yet enabled (stage \u2026)\u201d or outside its canary share: "
    "V2 once the stage is on",
    "held": "the kill switch, or pinned to V1 by the deployment's environment",
}
WINDOW_TITLES = {
    "1h": "the last hour",
    "24h": "the last 24 hours",
    "7d": "the last 7 days",
    "all": "all time",
}
TOP_FAMILIES = 15  # a chart shows the families with the most fallbacks of its kind ...
TOP_REASONS = 8  # ... and its reasons with the most deployments; the rest as one "other"


class BadFilter(ValueError):
    """A family or stage filter that the pack does not have (the message names the closest)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_filter(services: Services, family: str | None, stage: str | None) -> None:
    """Raises BadFilter for a family or a stage (cohort id) the pack does not have."""
    policy = services.policy
    if family is not None and family not in policy.pack.families:
        raise BadFilter("family", policy.unknown_family_message(family))
    stages = list(policy.cohort_labels())
    if stage is not None and stage not in stages:
        close = closest(stage, stages)
        hint = f" (did you mean {close!r}?)" if close else ""
        if stage in policy.pack.families:
            hint = (
                f" ({stage!r} is a family: filter by family, or by its stage "
                f"{policy.resolve_cohort(stage)!r})"
            )
        raise BadFilter(
            "stage", f"unknown stage {stage!r}{hint}; the pack's stages: {', '.join(stages)}"
        )


@dataclass
class View:
    report: FallbackReport
    labels: dict[str, str]  # reason key → label
    enabled: dict[str, EnabledSince]  # reason key of a stage that is on now → since when


def build(
    services: Services,
    session: Session,
    *,
    window: str,
    fleet: FleetFilter,
    now: dt.datetime | None = None,
) -> View:
    """The report of ``window`` (``aggregates.WINDOWS``) for ``fleet`` with its labels."""
    report = aggregates.fallbacks(session=session, window=window, fleet=fleet, now=now)
    enabled = aggregates.stages_enabled_since(canary_store.list_canaries(session=session))
    return View(report, services.policy.reason_labels(), enabled)


def _bin_label(t: dt.datetime, bin_s: int) -> str:
    return t.strftime("%Y-%m-%d" if bin_s >= 86400 else "%m-%d %H:%M")


def _kind_chart(
    view: View, kind: str, all_families: bool, all_reasons: bool
) -> dict[str, Any] | None:
    """One kind's chart data: families (most fallbacks of the kind first), the top reasons
    (or all) each with its count per family and per time bin, the rest summed as "other";
    None when the kind has no deployment in the report."""
    r = view.report
    ranked = [(k, n) for k, n in r.ranked if reason_kind(k) == kind]
    if not ranked:
        return None
    per_family = {f: sum(c[k] for k, _n in ranked) for f, c in r.by_family.items()}
    families = sorted((f for f, n in per_family.items() if n), key=lambda f: (-per_family[f], f))
    shown = families if all_families else families[:TOP_FAMILIES]
    top = ranked if all_reasons else ranked[:TOP_REASONS]
    rest = ranked[len(top) :]
    zeros = [0] * len(r.bins)
    none: Counter[str] = Counter()
    datasets: list[dict[str, Any]] = [
        {
            "key": k,
            "label": view.labels.get(k, k),
            "by_family": [r.by_family.get(f, none).get(k, 0) for f in shown],
            "over_time": r.over_time.get(k, zeros),
        }
        for k, _n in top
    ]
    if rest:
        datasets.append(
            {
                "key": "",
                "label": f"{len(rest)} other reason{'s' if len(rest) > 1 else ''}",
                "by_family": [
                    sum(r.by_family.get(f, none).get(k, 0) for k, _n in rest) for f in shown
                ],
                "over_time": [
                    sum(col)
                    for col in zip(*(r.over_time.get(k, zeros) for k, _n in rest), strict=True)
                ],
            }
        )
    return {
        "families": shown,
        "num_families": len(families),
        "num_reasons": len(ranked),
        "reasons": datasets,
        "height_px": max(300, 26 * len(shown) + 120),
        "deployments": r.by_kind.get(kind, 0),
    }


def charts(view: View, *, all_families: bool, all_reasons: bool) -> dict[str, Any]:
    """The page's chart data (embedded as JSON, drawn by static/fallbacks.js)."""
    r = view.report
    return {
        "bins": [_bin_label(b, r.bin_s) for b in r.bins],
        "kinds": {k: _kind_chart(view, k, all_families, all_reasons) for k in KINDS},
    }


def page_context(
    services: Services,
    session: Session,
    *,
    window: str,
    family: str,
    stage: str,
    all_families: bool,
    all_reasons: bool,
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, template context) of the ``/fallbacks`` page; an unknown family or
    stage is a 422 page that names the closest (the filters stay to correct it)."""
    params = {
        "window": window,
        "family": family,
        "stage": stage,
        "families": "all" if all_families else "",
        "reasons": "all" if all_reasons else "",
    }
    context: dict[str, Any] = {
        "window": window,
        "family": family,
        "stage": stage,
        "window_titles": WINDOW_TITLES,
        "kind_titles": KIND_TITLES,
        "kind_notes": KIND_NOTES,
        "kinds": KINDS,
        "family_names": services.policy.family_names(),
        "stages": list(services.policy.cohort_labels().items()),
        "all_families": all_families,
        "all_reasons": all_reasons,
        "link": lambda **over: _query({**params, **over}),
        "top_families": TOP_FAMILIES,
        "top_reasons": TOP_REASONS,
    }
    try:
        check_filter(services, family or None, stage or None)
    except BadFilter as err:
        return 422, {**context, "error": str(err)}
    fleet = FleetFilter(family=family or None, stage=stage or None)
    view = build(services, session, window=window, fleet=fleet)
    return 200, {
        **context,
        "report": view.report,
        "labels": view.labels,
        "enabled": view.enabled,
        "reason_kind": reason_kind,
        "chart": charts(view, all_families=all_families, all_reasons=all_reasons),
    }


def _query(params: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return "/fallbacks?" + urlencode({k: v for k, v in params.items() if v})
