"""A ramp's gates: what must hold before its stage moves to the next share. Pure functions of
the figures they are given (no I/O, time a parameter); ``dashboard.store.ramps`` reads the
figures and acts on the outcome.

Each gate answers ``pass``, ``fail`` or ``wait``: a ramp steps on only when every gate passes,
a ``fail`` pauses it or rolls its stage back (the ramp's ``on_failure``), a ``wait`` (too few
figures yet: too few engines reporting, no parity run, a parity run too old, the kill switch
engaged) holds it where it is.

- ``kill_switch``: wait while the kill switch is engaged (the share would not apply).
- ``parity_evidence``: each family of the stage's latest parity run passed (fail when one
  failed) and is at most ``evidence_max_age_s`` old (wait when one is missing or older).
- ``health_engines``: at least ``min_engines`` engines of each runner reported health (V2
  since the current step started, V1 since the ramp started); else every health gate waits.
- ``v2_error_rate``: V2's error rate (errors / requests) at most ``max_error_rate_ratio``
  times V1's, V1's taken as at least ``error_rate_floor`` (V1 at 0 % would make one V2 error
  a failure).
- ``v2_crash_rate``: V2's crash rate (crashes / engines) at most V1's or
  ``max_crash_rate``, whichever is higher.
- ``v2_tpot_p99``: V2's TPOT p99 at most ``max_tpot_p99_ratio`` times V1's.
- ``promql:<name>``: a PromQL query against the fleet's Prometheus (``dashboard/promql.py``),
  its one value compared with a threshold. No data, NaN, several series or an unreachable
  Prometheus make it wait (never pass); after ``max_inconclusive_rounds`` such rounds in a
  row the ramp pauses.

Health figures come from the engines' health reports (``dashboard.store.health``), per
runner, in the ramp's cohort.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from string import Template
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Status = Literal["pass", "fail", "wait"]
DAY_S = 86_400


Comparison = Literal["<", "<=", ">", ">="]
#: The placeholders a PromQL gate's query may use: ``$stage`` (the ramp's stage, the
#: ``turnout_stage`` label of its engines) and ``$window`` (the gate's range, "5m").
QUERY_PLACEHOLDERS = ("stage", "window")


class PromqlGate(BaseModel):
    """A gate on the fleet's Prometheus: ``query`` (a PromQL template over ``$stage`` and
    ``$window``) must give one value, and ``value <comparison> threshold`` must hold.

    Example: the canary's p95 time to first token at most 1.2 times the baseline's::

        {"name": "ttft_p95_ratio", "comparison": "<=", "threshold": 1.2, "window": "5m",
         "query": "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{turnout_stage=\"$stage\",turnout_cohort=\"canary\"}[$window]))) / histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{turnout_stage=\"$stage\",turnout_cohort=\"baseline\"}[$window])))"}
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,47}$", description="the gate's name")
    query: str = Field(min_length=1, max_length=4000, description="PromQL over $stage, $window")
    comparison: Comparison
    threshold: float = Field(allow_inf_nan=False)
    window: str = Field(
        default="5m", pattern=r"^[1-9][0-9]{0,4}[smh]$", description="a PromQL range, 30s..9999h"
    )

    @field_validator("window")
    @classmethod
    def _window_range(cls, window: str) -> str:
        seconds = int(window[:-1]) * {"s": 1, "m": 60, "h": 3600}[window[-1]]
        if not 30 <= seconds <= 9999 * 3600:
            raise ValueError(f"window {window!r} is not in 30s..9999h")
        return window

    @field_validator("query")
    @classmethod
    def _placeholders(cls, query: str) -> str:
        template = Template(query)
        if not template.is_valid():
            raise ValueError("a $ that is no placeholder: write $$ for a literal $")
        unknown = sorted(set(template.get_identifiers()) - set(QUERY_PLACEHOLDERS))
        if unknown:
            raise ValueError(
                f"unknown placeholder ${unknown[0]}: a query may use "
                + ", ".join(f"${p}" for p in QUERY_PLACEHOLDERS)
            )
        return query

    def render(self, stage: str) -> str:
        """The query for one ramp's stage (label values are quoted by the template)."""
        return Template(self.query).substitute(stage=_label_value(stage), window=self.window)

    def holds(self, value: float) -> bool:
        return {
            "<": value < self.threshold,
            "<=": value <= self.threshold,
            ">": value > self.threshold,
            ">=": value >= self.threshold,
        }[self.comparison]


def _label_value(text: str) -> str:
    """``text`` escaped for a PromQL double-quoted label value."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class GateConfig(BaseModel):
    """A ramp's thresholds (each ramp keeps its own; the defaults are the service's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    evidence_max_age_s: int = Field(
        default=7 * DAY_S,
        ge=60,
        le=365 * DAY_S,
        description="the oldest parity run that counts, seconds",
    )
    min_engines: int = Field(
        default=1,
        ge=1,
        le=1_000_000,
        description="engines of each runner that must have reported "
        "health before the health gates decide",
    )
    max_error_rate_ratio: float = Field(
        default=2.0, ge=1.0, le=1000.0, description="V2's error rate / V1's, at most"
    )
    error_rate_floor: float = Field(
        default=0.001,
        ge=0.0,
        le=1.0,
        description="V1's error rate is taken as at least this fraction in the ratio",
    )
    max_crash_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=1000.0,
        description="V2's crashes per engine, at most (or V1's, when higher)",
    )
    max_tpot_p99_ratio: float = Field(
        default=1.5, ge=1.0, le=1000.0, description="V2's TPOT p99 / V1's, at most"
    )
    health_reports: bool = Field(
        default=True,
        description="gate on the engines' health reports (health_engines and the three "
        "V2-against-V1 gates); off for a fleet gated by Prometheus alone",
    )
    promql: tuple[PromqlGate, ...] = Field(
        default=(),
        max_length=20,
        strict=False,  # a JSON list (the stored ramp's gates) is the tuple
        description="gates on the fleet's Prometheus",
    )
    max_inconclusive_rounds: int = Field(
        # 10 minutes at the ticker's default 5 s: long enough for a step's engines to
        # restart and fill a 5m rate() window, short enough that a dead Prometheus is seen.
        default=120,
        ge=1,
        le=100_000,
        description="PromQL rounds in a row without a verdict (no data, NaN, Prometheus "
        "unreachable) after which the ramp pauses; a round is one pass of the ticker "
        "(TURNOUT_TICK_S, 5 s by default)",
    )

    @model_validator(mode="after")
    def _some_health_gate(self) -> GateConfig:
        # Without either, only the kill switch and the parity evidence would gate the ramp
        # (and a stage that names no family has no evidence to wait for): nothing would
        # watch V2's health.
        if not self.health_reports and not self.promql:
            raise ValueError(
                "health_reports false needs PromQL gates: without either, nothing watches "
                "the canary's health"
            )
        return self

    @field_validator("promql")
    @classmethod
    def _unique_names(cls, gates: tuple[PromqlGate, ...]) -> tuple[PromqlGate, ...]:
        names = [g.name for g in gates]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two PromQL gates are named {name!r}")
        return gates


class RunnerHealthLike(Protocol):
    """What the gates read of one runner's health in a cohort and a time window (the shape of
    ``dashboard.store.health.RunnerHealth``)."""

    @property
    def num_engines(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def error_rate(self) -> float: ...
    @property
    def crash_rate(self) -> float: ...
    @property
    def tpot_p99_ms(self) -> float | None: ...


@dataclass(frozen=True)
class Evidence:
    """A family's latest parity run, as the evidence gate reads it."""

    family: str
    result: str  # pass | fail
    recorded_at: dt.datetime
    suite: str = ""
    num_failures: int | None = None
    num_errors: int | None = None
    num_tests: int | None = None


@dataclass(frozen=True)
class GateResult:
    gate: str
    status: Status
    message: str  # "gate v2_error_rate: v2 4.1% vs v1 0.2% (max ratio 2.0)"
    figures: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "status": self.status,
            "message": self.message,
            "figures": self.figures,
        }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _age(seconds: float) -> str:
    for unit, size in (("d", DAY_S), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def kill_switch_gate(engaged: bool) -> GateResult:
    if engaged:
        return GateResult(
            "kill_switch",
            "wait",
            "gate kill_switch: engaged (every auto deployment runs V1; the ramp holds)",
            {"engaged": True},
        )
    return GateResult("kill_switch", "pass", "gate kill_switch: released", {"engaged": False})


def _one_evidence(
    family: str, e: Evidence | None, now: dt.datetime, max_age_s: int
) -> tuple[Status, str]:
    if e is None:
        return "wait", f"{family}: no parity run"
    age = (now - e.recorded_at).total_seconds()
    counts = (
        ""
        if e.num_tests is None
        else (f", {(e.num_failures or 0) + (e.num_errors or 0)} failed of {e.num_tests}")
    )
    said = f"{family} {e.result} {_age(max(age, 0))} ago ({e.suite}{counts})"
    if e.result != "pass":
        return "fail", said
    if age > max_age_s:
        return "wait", said + f", older than {_age(max_age_s)}"
    return "pass", said


def evidence_gate(
    families: tuple[str, ...], latest: Mapping[str, Evidence], now: dt.datetime, config: GateConfig
) -> GateResult:
    """The ``parity_evidence`` gate over ``families`` (the stage's) and each one's latest
    run."""
    if not families:
        return GateResult(
            "parity_evidence", "pass", "gate parity_evidence: the stage has no family yet", {}
        )
    parts = {f: _one_evidence(f, latest.get(f), now, config.evidence_max_age_s) for f in families}
    statuses = {s for s, _m in parts.values()}
    status: Status = "fail" if "fail" in statuses else "wait" if "wait" in statuses else "pass"
    # Failing families first, then waiting ones: a message cut to fit an audit reason (a
    # stage of dozens of families) still names them.
    order = {"fail": 0, "wait": 1, "pass": 2}
    ranked = sorted(parts.values(), key=lambda part: order[part[0]])
    message = "gate parity_evidence: " + "; ".join(m for _s, m in ranked)
    return GateResult("parity_evidence", status, message, {f: s for f, (s, _m) in parts.items()})


def _engines_gate(
    v1: RunnerHealthLike | None, v2: RunnerHealthLike | None, config: GateConfig
) -> GateResult:
    n1, n2 = (h.num_engines if h else 0 for h in (v1, v2))
    ok = n1 >= config.min_engines and n2 >= config.min_engines
    return GateResult(
        "health_engines",
        "pass" if ok else "wait",
        f"gate health_engines: v2 {n2} vs v1 {n1} engines reporting (min {config.min_engines})",
        {"v1": n1, "v2": n2},
    )


def _error_gate(v1: RunnerHealthLike, v2: RunnerHealthLike, config: GateConfig) -> GateResult:
    limit = max(v1.error_rate, config.error_rate_floor) * config.max_error_rate_ratio
    ok = v2.error_rate <= limit
    return GateResult(
        "v2_error_rate",
        "pass" if ok else "fail",
        f"gate v2_error_rate: v2 {_pct(v2.error_rate)} vs v1 "
        f"{_pct(v1.error_rate)} (max ratio {config.max_error_rate_ratio:g})",
        {"v1": v1.error_rate, "v2": v2.error_rate, "limit": limit},
    )


def _crash_gate(v1: RunnerHealthLike, v2: RunnerHealthLike, config: GateConfig) -> GateResult:
    limit = max(v1.crash_rate, config.max_crash_rate)
    ok = v2.crash_rate <= limit
    return GateResult(
        "v2_crash_rate",
        "pass" if ok else "fail",
        f"gate v2_crash_rate: v2 {v2.crash_rate:.2f} vs v1 {v1.crash_rate:.2f} "
        f"crashes per engine (max {limit:.2f})",
        {"v1": v1.crash_rate, "v2": v2.crash_rate, "limit": limit},
    )


def _tpot_gate(v1: RunnerHealthLike, v2: RunnerHealthLike, config: GateConfig) -> GateResult:
    t1, t2 = v1.tpot_p99_ms, v2.tpot_p99_ms
    if t1 is None or t2 is None:
        return GateResult(
            "v2_tpot_p99",
            "wait",
            "gate v2_tpot_p99: no TPOT reported by " + ("v1" if t1 is None else "v2"),
            {"v1": t1, "v2": t2},
        )
    ok = t2 <= t1 * config.max_tpot_p99_ratio
    return GateResult(
        "v2_tpot_p99",
        "pass" if ok else "fail",
        f"gate v2_tpot_p99: v2 {t2:.1f} ms vs v1 {t1:.1f} ms "
        f"(max ratio {config.max_tpot_p99_ratio:g})",
        {"v1": t1, "v2": t2, "limit": t1 * config.max_tpot_p99_ratio},
    )


def health_gates(
    v1: RunnerHealthLike | None, v2: RunnerHealthLike | None, config: GateConfig
) -> list[GateResult]:
    """``health_engines`` and, once it passes, the three V2-against-V1 gates."""
    engines = _engines_gate(v1, v2, config)
    if engines.status != "pass" or v1 is None or v2 is None:
        return [engines]
    return [
        engines,
        _error_gate(v1, v2, config),
        _crash_gate(v1, v2, config),
        _tpot_gate(v1, v2, config),
    ]


@dataclass(frozen=True)
class PromqlReading:
    """What Prometheus answered for one PromQL gate: ``value``, or why there is none
    (``problem``: no data, NaN, several series, unreachable, a bad query)."""

    query: str
    value: float | None
    problem: str | None = None
    at: dt.datetime | None = None


def promql_gate(
    gate: PromqlGate, reading: PromqlReading, inconclusive_before: int, config: GateConfig
) -> GateResult:
    """One PromQL gate's verdict: pass or fail on a value; wait without one, and fail with
    ``inconclusive: true`` (the ramp pauses, whatever its ``on_failure``) once
    ``max_inconclusive_rounds`` rounds in a row had none."""
    name = f"promql:{gate.name}"
    figures: dict[str, Any] = {
        "query": reading.query,
        "value": reading.value,
        "comparison": gate.comparison,
        "threshold": gate.threshold,
        "at": reading.at.isoformat() if reading.at else None,
    }
    if reading.value is None:
        rounds = inconclusive_before + 1
        figures["inconclusive_rounds"] = rounds
        why = reading.problem or "no data"
        if rounds >= config.max_inconclusive_rounds:
            figures["inconclusive"] = True
            return GateResult(
                name,
                "fail",
                f"gate {name}: inconclusive for {rounds} rounds in a row ({why}); the ramp pauses",
                figures,
            )
        return GateResult(
            name,
            "wait",
            f"gate {name}: inconclusive ({why}; round {rounds} of "
            f"{config.max_inconclusive_rounds})",
            figures,
        )
    figures["inconclusive_rounds"] = 0
    ok = gate.holds(reading.value)
    return GateResult(
        name,
        "pass" if ok else "fail",
        f"gate {name}: {reading.value:.4g} {'' if ok else 'not '}{gate.comparison} "
        f"{gate.threshold:g}",
        figures,
    )


def inconclusive_rounds(last_gates: list[dict[str, Any]] | None, name: str) -> int:
    """How many rounds in a row gate ``name`` was inconclusive, as the last evaluation kept
    it (``Ramp.last_gates``)."""
    for g in last_gates or ():
        if isinstance(g, dict) and g.get("gate") == name:
            rounds = (g.get("figures") or {}).get("inconclusive_rounds", 0)
            return rounds if isinstance(rounds, int) and rounds >= 0 else 0
    return 0


def outcome(results: list[GateResult]) -> Status:
    """``fail`` if a gate failed, else ``wait`` if one waits, else ``pass``."""
    statuses = {r.status for r in results}
    return "fail" if "fail" in statuses else "wait" if "wait" in statuses else "pass"
