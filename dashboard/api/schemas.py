"""Request and response bodies of the JSON API (they make the OpenAPI document).

The bodies engines and the CLI exchange with the service too (the canary snapshot, decision
events, deployment inputs) are defined once in ``oracle.wire`` and re-exported here."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnout.dashboard.junit import result_of
from turnout.dashboard.store.audit import MAX_REASON_CHARS
from turnout.dashboard.store.latest_counts import Kind
from turnout.dashboard.store.launches import LaunchRecord
from turnout.dashboard.store.models import DecisionEvent
from turnout.oracle.wire import (
    CanariesOut,
    CohortOut,
    DeploymentIn,
    EventIn,
    IngestIn,
    KillSwitchOut,
)

__all__ = ["CanariesOut", "CohortOut", "DeploymentIn", "EventIn", "IngestIn", "KillSwitchOut"]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    detail: ErrorBody


class InvalidRequestBody(BaseModel):
    code: Literal["invalid_request"]
    message: str = Field(description="each wrong field (where, what is wrong), one sentence")
    errors: list[dict[str, Any]] = Field(
        description="the validator's errors: type, loc (body / query / header / path, then "
        "the field), msg, and input where it is small"
    )


class InvalidRequestResponse(BaseModel):
    """A 422 for a request that does not validate (every route: bodies, query parameters,
    headers, path parameters)."""

    detail: InvalidRequestBody


class CanaryFlipOut(CohortOut):
    changed: bool = Field(
        description="false when the cohort already had the state asked for: "
        "its version stays and no audit entry is written"
    )


class KillSwitchSetOut(KillSwitchOut):
    changed: bool = Field(
        description="false when the kill switch was already in the state "
        "asked for: its version stays and no audit entry is written"
    )


class CanaryPatch(BaseModel):
    # Strict: JSON true is not 1%, "yes" is not true (lax parsing turned them into a change).
    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool
    percentage: int | None = Field(default=None, ge=0, le=100)
    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, pattern=r"\S")


class KillSwitchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    engaged: bool
    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, pattern=r"\S")


class AuditOut(BaseModel):
    id: int
    at: dt.datetime
    actor: str
    action: str
    target: str
    reason: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class IngestOut(BaseModel):
    accepted: int = Field(
        description="events now stored (new ones, resent duplicates, and "
        "follow-ups whose start-up line is kept with their decision)"
    )
    inserted: int = Field(
        description="decisions that were new (a follow-up carrying vLLM's "
        "start-up line to a stored decision is none)"
    )
    batch_digest: str = Field(
        description="SHA-256 (hex) of the JSON list of the batch's event "
        "ids in the order sent (`oracle.wire.batch_digest`): engines "
        "take an answer as the acknowledgement of their batch only "
        "when it matches"
    )


class StartupOut(BaseModel):
    """What vLLM said at start-up about its runner (``turnout launch --report-startup``)."""

    runner: Literal["v1", "v2"]
    line: str = Field(description="vLLM's log line, as printed")
    at: dt.datetime = Field(description="when it was reported (the follow-up event's time)")
    event_id: str = Field(description="the event that reported it (`<decision id>.startup`)")
    agrees: bool = Field(
        description="vLLM's runner is the decision's; false: vLLM runs "
        "another runner than turnout decided"
    )


class LaunchOut(BaseModel):
    """How ``turnout launch`` started vLLM with the decision (``oracle.wire.LaunchIn``)."""

    vllm_version: str
    vllm_pack: str = Field(description="the pack whose selection stood for vLLM's own")
    has_pack: bool
    env: dict[str, str] = Field(description="the variables launch set for vLLM")
    operator_pin: str | None = Field(description="the runner variable as the operator set it")
    snapshot_source: str = Field(
        description="service, disk or defaults: where the canaries came from"
    )
    startup: StartupOut | None = Field(
        description="vLLM's start-up line; null until its "
        "follow-up event arrives (exec mode reports none)"
    )

    @classmethod
    def of(cls, record: LaunchRecord | None) -> LaunchOut | None:
        if record is None:
            return None
        s = record.startup
        return cls(
            vllm_version=record.vllm_version,
            vllm_pack=record.vllm_pack,
            has_pack=record.has_pack,
            env=record.env,
            operator_pin=record.operator_pin,
            snapshot_source=record.snapshot_source,
            startup=None
            if s is None
            else StartupOut(
                runner=s["runner"],
                line=s["line"],
                at=s["at"],
                event_id=s["event_id"],
                agrees=bool(record.agrees),
            ),
        )


class EventOut(BaseModel):
    event_id: str
    at: dt.datetime
    deployment_id: str
    host: str
    pack: str
    family: str
    runner: str | None
    mode: str
    stage: str | None
    reason_code: str
    rule_ids: list[str]
    policy_digest: str
    demo: bool
    launch: LaunchOut | None = Field(
        default=None,
        description="how `turnout launch` started "
        "vLLM with this decision (null: an engine's own decision)",
    )

    @classmethod
    def of(cls, row: DecisionEvent) -> EventOut:
        return cls(
            event_id=row.event_id,
            at=row.at,
            deployment_id=row.deployment_id,
            host=row.host,
            pack=row.pack,
            family=row.family,
            runner=row.runner,
            mode=row.mode,
            stage=row.stage,
            reason_code=row.reason_code,
            rule_ids=row.rule_ids,
            policy_digest=row.policy_digest,
            demo=row.demo,
            launch=LaunchOut.of(LaunchRecord.of(row)),
        )


Window = Literal["1h", "24h", "7d", "all"]
ReasonKind = Kind


class RankedReason(BaseModel):
    key: str
    label: str
    kind: ReasonKind = Field(
        description="blocked: a rule of the pack V2 does not serve yet "
        "(a real incompatibility); waiting: its rollout stage is off or "
        "it is outside the canary share; held: the kill switch or a V1 pin"
    )
    deployments: int = Field(
        description="deployments whose latest decision (in the window) carries this reason"
    )
    stage_enabled_since: dt.datetime | None = Field(
        default=None,
        description="for a stage's not-yet-enabled reason whose stage is on "
        "now: when it was turned on. These deployments' latest decisions predate the flip; "
        "they decide again at their next start and report",
    )


class FamilyFallbacks(BaseModel):
    deployments: int = Field(description="deployments of the family in the window")
    fallbacks: int = Field(description="of them, not on V2")
    by_kind: dict[ReasonKind, int]


class FallbacksOverTime(BaseModel):
    bin_s: int = Field(description="the width of a bin, seconds (300, 3600, 21600 or 86400)")
    bins: list[dt.datetime] = Field(description="the start of each bin, UTC, oldest first")
    by_reason: dict[str, list[int]] = Field(
        description="reason key → per bin, the deployments whose latest decision falls in it: "
        "the deployments `ranked` counts, so each list adds up to its reason's count"
    )


class OtherReasons(BaseModel):
    """The reasons past ``limit`` in the ranking, summed."""

    num_reasons: int = Field(description="how many reasons are summed here")
    deployments: int = Field(
        description="their deployments added up (a deployment held back by two of them counts "
        "twice, as it does in `ranked`)"
    )
    by_family: dict[str, int] = Field(description="family → the same sum in that family")
    over_time: list[int] = Field(description="the same sum per bin of `over_time`")


class FallbacksOut(BaseModel):
    window: Window
    since: dt.datetime | None = Field(
        description="the window's start (now minus the window, down to a 5-minute "
        "boundary; the 7-day one down to an hour); for all, the first day the database keeps "
        "(`turnout db retention`), null when it keeps every day"
    )
    family: str | None
    stage: str | None
    pack: str | None
    num_deployments: int = Field(
        description="deployments whose latest decision is in the window (and the filters)"
    )
    num_fallbacks: int = Field(description="of them, those not on V2")
    by_kind: dict[ReasonKind, int] = Field(
        description="fallbacks by the kind of what holds them back (a deployment counts once)"
    )
    num_reasons: int = Field(description="reasons in the window, `ranked` and `other` together")
    ranked: list[RankedReason] = Field(
        description="the first `limit` reasons, most deployments first"
    )
    other: OtherReasons | None = Field(
        description="the reasons past `limit`, summed; null when `ranked` holds them all"
    )
    by_family: dict[str, dict[str, int]] = Field(
        description="family → reason key → deployments (the reasons of `ranked`)"
    )
    families: dict[str, FamilyFallbacks]
    over_time: FallbacksOverTime


class ImpactOut(BaseModel):
    cohort: str
    enabled: bool
    num_considered: int = Field(description="recorded deployments with a stored config")
    num_changed: int
    to_v2: int
    to_v1: int
    examples: list[str] = Field(description="up to 20 deployment ids that would change")


MAX_EVIDENCE_DETAILS = 10_000


class EvidenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    family: str = Field(
        min_length=1,
        max_length=64,
        examples=["qwen3"],
        description="a family of the pack (families.yaml), as decisions name it",
    )
    runner_pair: str = Field(default="v1:v2", pattern=r"^v[12]:v[12]$")
    suite: str = Field(min_length=1, max_length=128)
    result: Literal["pass", "fail"]
    details: str = Field(default="", max_length=MAX_EVIDENCE_DETAILS)
    num_tests: int | None = Field(
        default=None, ge=0, le=10**9, description="tests run (a JUnit report's count)"
    )
    num_failures: int | None = Field(default=None, ge=0, le=10**9)
    num_errors: int | None = Field(default=None, ge=0, le=10**9)
    num_skipped: int | None = Field(default=None, ge=0, le=10**9)

    @model_validator(mode="after")
    def _result_agrees_with_the_counts(self) -> EvidenceIn:
        """The counts, where given, agree with each other and with ``result`` (a parity gate
        passes on this record): failures, errors and skips add up to at most ``num_tests``; a
        ``pass`` has no failure or error; with ``num_tests`` given (a count left out is 0),
        ``result`` is the one the counts make (``dashboard.junit.result_of``: a pass needs a
        test that passed).

        Raises:
            ValueError: naming the counts that disagree (the API answers 422).
        """
        counts = {
            "num_failures": self.num_failures,
            "num_errors": self.num_errors,
            "num_skipped": self.num_skipped,
        }
        given = {name: value for name, value in counts.items() if value}
        if self.num_tests is not None and sum(given.values()) > self.num_tests:
            named = " + ".join(f"{name} {value}" for name, value in given.items())
            raise ValueError(f"{named} is more than num_tests {self.num_tests}")
        if self.result == "pass" and (self.num_failures or self.num_errors):
            raise ValueError(
                f"result pass with {self.num_failures or 0} failure(s) and "
                f"{self.num_errors or 0} error(s): a pass has none"
            )
        if self.num_tests is not None:  # a count left out is none of that kind
            made = result_of(self.num_tests, **{k: v or 0 for k, v in counts.items()})
            if made != self.result:
                raise ValueError(
                    f"result {self.result}, but {self.num_tests} test(s) with "
                    + ", ".join(f"{name} {value or 0}" for name, value in counts.items())
                    + f" make a {made} (a pass needs a test that passed and none that failed)"
                )
        return self


class EvidenceOut(EvidenceIn):
    id: int
    recorded_at: dt.datetime
    recorded_by: str

    @model_validator(mode="after")
    def _result_agrees_with_the_counts(self) -> EvidenceOut:
        """A stored record is shown as it was recorded (one recorded before the counts were
        checked may disagree with them): the check is EvidenceIn's, on the way in."""
        return self


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"\S")
    role: Literal["viewer", "engine", "operator", "admin"]
    expires_in: str | None = Field(
        default=None,
        max_length=16,
        examples=["30d", "12h"],
        description="lifetime (a number and s, m, h, d or w; at most 3660d); none: the token "
        "never expires",
    )


class TokenOut(BaseModel):
    id: int
    name: str
    role: str
    prefix: str
    created_at: dt.datetime
    created_by: str
    revoked: bool
    revoked_at: dt.datetime | None = Field(default=None, description="null: not revoked")
    expires_at: dt.datetime | None = Field(description="when it stops being accepted (null: never)")


class TokenCreated(TokenOut):
    token: str = Field(description="shown once; store it now")


class RevokeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, pattern=r"\S")


class MatrixOut(BaseModel):
    num_cells: int
    pins: list[str] = Field(description="runner pins of the grid: auto, v1, v2")
    scenarios: list[str] = Field(description="column ids, the oracle's order")
    grid: dict[str, dict[str, dict[str, dict[str, int]]]] = Field(
        description="pin → family → scenario → runner (v1, v2, none) → cells"
    )


class UpgradeSideOut(BaseModel):
    pack: str
    runner: str | None = Field(description="v1, v2, or null: the engine would not start")
    reason_code: str
    why: list[str] = Field(
        description="reason ids (rules, step.<id> refusals, pins, "
        "error.<code>), or the reason code when none"
    )
    reasons: list[dict[str, str]] = Field(description="{rule_id, label} of each reason")
    steps: list[str] = Field(
        description="ids of the normalising steps that applied under "
        "this pack only (when the runner changes and both start)"
    )
    error: str | None
    error_code: str | None


class UpgradeExampleOut(BaseModel):
    deployment_id: str
    model: str | None
    change: str = Field(description="before→after: v1, v2 or refuse (no runner)")
    demo: bool
    before: UpgradeSideOut
    after: UpgradeSideOut


class UpgradeFamilyOut(BaseModel):
    family: str
    label: str
    deployments: int
    changed: int
    changes: dict[str, int] = Field(description="change (v1→v2, v2→refuse, …) → deployments")
    why_before: dict[str, int] = Field(
        description="the most common reason ids of the "
        "changed deployments under from_pack → deployments"
    )
    why_after: dict[str, int]
    examples: list[UpgradeExampleOut] = Field(
        description="up to 20 deployments that would switch, most common change first"
    )


class UpgradePreviewOut(BaseModel):
    from_pack: str
    to_pack: str
    num_deployments: int = Field(description="recorded deployments (each one's latest decision)")
    num_considered: int = Field(description="those decided by both packs")
    num_without_config: int = Field(description="recorded without a config (left out)")
    num_unreadable: int = Field(description="with a config this build cannot read (left out)")
    num_changed: int
    changes: dict[str, int]
    unknown_fields: dict[str, list[str]] = Field(
        description="pack → fields its release does not have and the other pack's does (a "
        "deployment that sets one is refused by name: unknown_setting)"
    )
    families: list[UpgradeFamilyOut] = Field(
        description="most changed first; unreadable configs are not a family here"
    )


class RunnerHealthOut(BaseModel):
    """One runner's health over a range (``dashboard.store.health.RunnerHealth``)."""

    runner: str
    num_reports: int
    num_engines: int = Field(description="distinct deployment ids reporting")
    num_requests: int
    num_errors: int
    num_crashes: int
    error_rate: float = Field(description="num_errors / max(num_requests, 1)")
    crash_rate: float = Field(description="num_crashes / max(num_engines, 1)")
    ttft_p99_ms: float | None = Field(
        description="request-weighted mean of the reported p99s (None: no request finished)"
    )
    tpot_p99_ms: float | None
    tokens_per_s: float = Field(
        description="output tokens over the seconds spent "
        "generating them (one engine's rate while it works)"
    )


class HealthOverTime(BaseModel):
    bucket_s: int
    buckets: list[dt.datetime] = Field(description="each bucket's start")
    by_runner: dict[str, list[RunnerHealthOut | None]] = Field(
        description="runner → its health per bucket (null: no report ended in it)"
    )


class HealthOut(BaseModel):
    """V1 and V2 in one rollout stage (``GET /api/v1/health``)."""

    stage: str
    family: str | None
    since: dt.datetime
    until: dt.datetime
    by_runner: dict[str, RunnerHealthOut] = Field(
        description="runner → its health over the range (runners without reports absent)"
    )
    over_time: HealthOverTime
