"""Bodies of the closed-loop routes: ramps and their gates, scheduled flips, approvals,
webhooks and their outbox, the kill switch's reach."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from turnout.dashboard.gates import GateConfig
from turnout.dashboard.store.audit import MAX_REASON_CHARS
from turnout.dashboard.store.ramps import MAX_BAKE_S, MAX_STEPS
from turnout.dashboard.store.webhooks import MAX_URL_CHARS, Kind

Reason = Field(
    min_length=1,
    max_length=MAX_REASON_CHARS,
    pattern=r"\S",
    description="why (goes to the audit log)",
)
KindName = Literal[
    "flip",
    "ramp_step",
    "gate_failure",
    "kill_switch",
    "scheduled_flip",
    "approval",
    "restart_required",
]
assert set(KindName.__args__) == {k.value for k in Kind}  # type: ignore[attr-defined]


class ReasonIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reason: str = Reason


class StepIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    percentage: int = Field(ge=1, le=100, description="the cohort's V2 share in this step")
    bake_s: int = Field(
        ge=0,
        le=MAX_BAKE_S,
        description="how long the step holds, with "
        "every gate passing, before the next one, seconds",
    )


class RampIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    steps: list[StepIn] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description="shares rising strictly, e.g. 10, 25, 50, 100",
    )
    gates: GateConfig | None = Field(
        default=None,
        description="thresholds; a field left out takes the service's default (TURNOUT_RAMP_GATES)",
    )
    on_failure: Literal["pause", "rollback"] = Field(
        default="pause",
        description="what a failing gate does: pause the ramp at its step, "
        "or end it and disable the cohort",
    )
    reason: str = Reason


class GateResultOut(BaseModel):
    gate: str
    status: Literal["pass", "fail", "wait"]
    message: str
    figures: dict[str, Any]


class RampOut(BaseModel):
    id: int
    cohort: str
    state: str = Field(
        description="pending_approval, active, paused, completed, cancelled, "
        "rolled_back or rejected"
    )
    steps: list[StepIn]
    gates: GateConfig
    on_failure: str
    step_index: int = Field(description="the step applied now (0-based; -1 before the start)")
    percentage: int | None = Field(description="the share of the current step")
    step_started_at: dt.datetime | None
    next_step_at: dt.datetime | None = Field(
        description="when the current step's bake ends (the next step follows if every gate passes)"
    )
    started_at: dt.datetime | None
    version: int = Field(description="send it back in If-Match to cancel or resume")
    reason: str
    requested_by: str
    requested_at: dt.datetime
    approved_by: str | None
    approved_at: dt.datetime | None
    last_gates: list[GateResultOut] = Field(description="the last evaluation of every gate")
    last_checked_at: dt.datetime | None
    ended_at: dt.datetime | None
    end_reason: str | None


class ScheduledFlipIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    cohort: str = Field(min_length=1, max_length=64)
    enabled: bool
    percentage: int | None = Field(default=None, ge=0, le=100)
    # Not strict: the body's JSON string is the datetime (strict mode takes only datetimes).
    run_at: AwareDatetime = Field(
        strict=False, description="when, with its offset (2026-12-01T14:00:00Z)"
    )
    reason: str = Reason


class ScheduledFlipOut(BaseModel):
    id: int
    cohort: str
    enabled: bool
    percentage: int | None
    run_at: dt.datetime | None = Field(description="null: as soon as it is approved")
    state: str = Field(
        description="pending_approval, scheduled, done, failed, cancelled or rejected"
    )
    version: int
    reason: str
    requested_by: str
    requested_at: dt.datetime
    approved_by: str | None
    approved_at: dt.datetime | None
    done_at: dt.datetime | None
    result: str | None


class PendingOut(BaseModel):
    subject: Literal["ramp", "flip"]
    id: int
    cohort: str
    summary: str
    reason: str
    requested_by: str
    requested_at: dt.datetime
    version: int


class StageOut(BaseModel):
    cohort: str
    label: str
    position: int = Field(description="the stage's place in the rollout order, from 0")
    families: list[str] = Field(
        description="the families the stage names (none: it takes deployments by their "
        "attributes); a family name stands for the first stage that names it"
    )


class KillSwitchReachOut(BaseModel):
    engaged: bool
    version: int
    updated_at: dt.datetime
    updated_by: str
    v2_decided_before: int = Field(
        description="deployments whose latest decision is V2 and "
        "was made before the kill switch was engaged: they run V2 "
        "until they restart (0 while released)"
    )
    v2_decided_after: int = Field(
        description="deployments whose latest decision since the "
        "kill switch was engaged is V2 (pinned to V2)"
    )
    v2_engines_reporting: int = Field(
        description="engines whose latest health report since "
        "the kill switch was engaged says V2 (0 while released)"
    )


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(
        min_length=1, max_length=MAX_URL_CHARS, examples=["https://hooks.example.com/turnout"]
    )
    kinds: list[KindName] = Field(min_length=1, max_length=6)
    secret: str | None = Field(
        default=None,
        min_length=16,
        max_length=256,
        description="the HMAC key; made by the service when left out",
    )
    description: str = Field(default="", max_length=256)


class WebhookOut(BaseModel):
    id: int
    url: str
    kinds: list[str]
    description: str
    created_at: dt.datetime
    created_by: str
    removed_at: dt.datetime | None
    secret_prefix: str = Field(description="the secret's first characters")


class WebhookCreated(WebhookOut):
    secret: str = Field(description="shown once: the receiver verifies signatures with it")


class OutboxOut(BaseModel):
    id: int
    webhook_id: int
    delivery_id: str
    kind: str
    state: str = Field(description="pending, delivered or dead")
    num_attempts: int
    created_at: dt.datetime
    next_attempt_at: dt.datetime
    last_attempt_at: dt.datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: dt.datetime | None
    payload: dict[str, Any]


class OutboxStatusOut(BaseModel):
    counts: dict[str, int] = Field(description="state → entries")
    entries: list[OutboxOut]
