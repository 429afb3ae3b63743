"""The default PromQL gates: a stage's canary engines against its baseline engines, on the
metrics vLLM exports (the names ``serving/metrics.py`` exports too), through the labels the
service's HTTP SD gives every engine (``turnout_stage``, ``turnout_cohort``).

Each metric name is checked against vLLM's own metrics code for the releases the packs
cover (``policies/reference/vllm-*/metrics.json``, written by ``python -m referee metrics``
from vllm/v1/metrics/loggers.py): tests/dashboard/test_vllm_gates.py.

Use them as a ramp's ``gates.promql`` (docs/fleet.md), whole or in part.
"""

from __future__ import annotations

import re

from turnout.dashboard.gates import PromqlGate


def _by_cohort(expr: str) -> tuple[str, str]:
    """``expr`` (with a ``COHORT`` selector) for the canary and for the baseline."""
    return tuple(  # type: ignore[return-value]
        expr.replace("COHORT", f'turnout_stage="$stage",turnout_cohort="{c}"')
        for c in ("canary", "baseline")
    )


def _p95(histogram: str) -> str:
    return f"histogram_quantile(0.95, sum by (le) (rate({histogram}_bucket{{COHORT}}[$window])))"


def _error_ratio() -> str:
    errors = 'sum(rate(vllm:request_success_total{COHORT,finished_reason="error"}[$window]))'
    return f"({errors} / sum(rate(vllm:request_success_total{{COHORT}}[$window])))"


def _preemptions_per_engine() -> str:
    return (
        "(sum(rate(vllm:num_preemptions_total{COHORT}[$window])) "
        "/ count(vllm:num_requests_running{COHORT}))"
    )


def _ratio(expr: str) -> str:
    canary, baseline = _by_cohort(expr)
    return f"({canary}) / ({baseline})"


def _difference(expr: str) -> str:
    canary, baseline = _by_cohort(expr)
    return f"{canary} - {baseline}"


VLLM_DEFAULT_GATES: tuple[PromqlGate, ...] = (
    PromqlGate(
        name="ttft_p95_ratio",
        query=_ratio(_p95("vllm:time_to_first_token_seconds")),
        comparison="<=",
        threshold=1.2,
    ),
    PromqlGate(
        name="itl_p95_ratio",
        query=_ratio(_p95("vllm:inter_token_latency_seconds")),
        comparison="<=",
        threshold=1.2,
    ),
    PromqlGate(
        name="error_ratio_delta",
        query=_difference(_error_ratio()),
        comparison="<=",
        threshold=0.005,  # 0.5 percentage points
    ),
    PromqlGate(
        name="preemption_rate_delta",
        query=_difference(_preemptions_per_engine()),
        comparison="<=",
        threshold=0.1,  # preemptions per second per engine
    ),
)


def metric_names(query: str) -> set[str]:
    """The metric names a query reads (``vllm:...``; a histogram's ``_bucket`` series read
    as the histogram, a counter's ``_total`` as the counter, as vLLM's code names them)."""
    names = set(re.findall(r"\b(vllm:[a-z_:]+)", query))
    return {re.sub(r"(_bucket|_total)$", "", n) for n in names}


__all__ = ["VLLM_DEFAULT_GATES", "metric_names"]
