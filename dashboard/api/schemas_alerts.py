"""The bodies of ``POST /api/v1/alertmanager``: Alertmanager's webhook notification (version 4)
and the service's answer, and the receipts ``GET /api/v1/alertmanager/receipts`` lists.

The notification's fields are Alertmanager's, under their names: see
https://prometheus.io/docs/alerting/latest/configuration/#webhook_config (the JSON body it
POSTs: ``version``, ``groupKey``, ``truncatedAlerts``, ``status``, ``receiver``,
``groupLabels``, ``commonLabels``, ``commonAnnotations``, ``externalURL`` and ``alerts``, each
with ``status``, ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``,
``fingerprint``). Fields of other senders (Grafana's ``orgId``, ``values``) are ignored. Every
size is bounded, so that a hostile body is refused (422) before it costs memory or storage.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

#: At most this many alerts per notification: set ``max_alerts`` of the webhook_config at or
#: below it (Alertmanager then sends the first ones and counts the rest in truncatedAlerts).
MAX_ALERTS = 5_000
MAX_LABELS = 64
MAX_ANNOTATIONS = 64
MAX_URL_CHARS = 2048

_NO_NUL = r"^[^\x00]*$"  # PostgreSQL stores no NUL in text or JSON
LabelName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_NO_NUL)]
LabelValue = Annotated[str, StringConstraints(max_length=1024, pattern=_NO_NUL)]
LabelSet = Annotated[dict[LabelName, LabelValue], Field(max_length=MAX_LABELS)]
Annotations = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=128)], Annotated[str, Field(max_length=16_384)]
    ],
    Field(max_length=MAX_ANNOTATIONS),
]
Url = Annotated[str, StringConstraints(max_length=MAX_URL_CHARS, pattern=_NO_NUL)]
_ZERO_YEAR = 1  # Go's zero time, 0001-01-01T00:00:00Z: "no end"


def _utc(value: dt.datetime) -> dt.datetime:
    """The time in UTC. Raises ValueError for one that UTC cannot hold (year 1 with a
    positive offset, 9999-12-31 with a negative one)."""
    try:
        return value.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        raise ValueError("the time is out of range in UTC") from None


UtcTime = Annotated[AwareDatetime, AfterValidator(_utc)]


class AlertmanagerAlert(BaseModel):
    """One alert of a notification."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["firing", "resolved"]
    labels: LabelSet
    annotations: Annotations = Field(default_factory=dict)
    starts_at: UtcTime = Field(alias="startsAt", description="when it started firing")
    ends_at: UtcTime | None = Field(
        default=None, alias="endsAt", description="when it ended (Go's zero time: not yet)"
    )
    generator_url: Url = Field(
        default="", alias="generatorURL", description="the rule's page in Prometheus"
    )
    fingerprint: str = Field(
        pattern=r"^[0-9A-Za-z._:-]{1,64}$",
        description="the hash of its labels (16 hex digits from Alertmanager)",
    )

    @property
    def ended_at(self) -> dt.datetime | None:
        """``endsAt``, None for Go's zero time."""
        if self.ends_at is None or self.ends_at.year == _ZERO_YEAR:
            return None
        return self.ends_at


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook notification, version 4 (``webhook_configs``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["4"]
    group_key: Annotated[str, Field(max_length=16_384)] = Field(default="", alias="groupKey")
    truncated_alerts: int = Field(default=0, ge=0, le=2**53, alias="truncatedAlerts")
    status: Literal["firing", "resolved"]
    receiver: Annotated[str, Field(max_length=1024)] = Field(
        description="the Alertmanager receiver's name (not the service's)"
    )
    group_labels: LabelSet = Field(default_factory=dict, alias="groupLabels")
    common_labels: LabelSet = Field(default_factory=dict, alias="commonLabels")
    common_annotations: Annotations = Field(default_factory=dict, alias="commonAnnotations")
    external_url: Url = Field(default="", alias="externalURL")
    alerts: list[AlertmanagerAlert] = Field(max_length=MAX_ALERTS)


class AlertActionOut(BaseModel):
    action: Literal["pause", "rollback", "kill_switch"]
    cohort: str | None = Field(description="the stage it acted on (none for the kill switch)")
    audit_id: int
    fingerprint: str = Field(description="the alert that acted")


class AlertsAck(BaseModel):
    """What the service did with a notification (after its commit)."""

    receiver: str = Field(description="the service's receiver the token chose")
    num_alerts: int
    outcomes: dict[str, int] = Field(
        description="alerts per outcome: acted, no_change, no_ramp, no_stage, unknown_stage, "
        "no_rule, duplicate, resolved"
    )
    actions: list[AlertActionOut] = Field(description="the changes made now (audited)")


class AlertReceiptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    receiver: str
    fingerprint: str
    starts_at: dt.datetime
    status: str
    labels: dict[str, str]
    generator_url: str
    action: str | None
    cohort: str | None
    outcome: str
    audit_id: int | None
    received_at: dt.datetime
    resolved_at: dt.datetime | None
