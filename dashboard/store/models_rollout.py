"""Tables of the closed rollout loop: ramps, scheduled flips (with their approvals), webhook
subscriptions and the webhook outbox (migration 0006), Alertmanager's alerts as received
(migration 0008).

A ramp and a scheduled flip that need a second operator's approval carry it themselves
(``state = "pending_approval"``, then ``requested_by`` / ``approved_by``): an approval is a
step of their life, not a row of its own. Times are timezone-aware UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from turnout.dashboard.store.models import Base, JSONType


class Ramp(Base):
    """A cohort's ramp: canary shares applied one after the other, each kept for its bake
    time while the ramp's gates hold.

    ``state``: ``pending_approval`` → ``active`` ⇄ ``paused`` → ``completed`` | ``cancelled`` |
    ``rolled_back`` | ``rejected``. At most one ramp per cohort is live (pending, active or
    paused): the store checks under the cohort's row lock. ``steps`` is
    ``[{"percentage": 10, "bake_s": 1800}, ...]``; ``step_index`` the step applied now (-1
    before the start), since ``step_started_at``. ``gates`` holds the thresholds
    (``dashboard.gates.GateConfig``), ``last_gates`` the last evaluation's results.
    """

    __tablename__ = "ramps"
    __table_args__ = (Index("ix_ramps_cohort_state", "cohort", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cohort: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(24))
    steps: Mapped[list[dict[str, Any]]] = mapped_column(JSONType)
    gates: Mapped[dict[str, Any]] = mapped_column(JSONType)
    on_failure: Mapped[str] = mapped_column(String(16))  # pause | rollback
    step_index: Mapped[int] = mapped_column(Integer, default=-1)
    step_started_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    # The cohort's canary version the request was made against (If-Match): the start, now or
    # at approval, checks it is still the current one.
    if_version: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer, default=1)
    reason: Mapped[str] = mapped_column(Text)
    requested_by: Mapped[str] = mapped_column(String(128))
    requester: Mapped[str] = mapped_column(String(128))  # who, for the two-person rule
    requested_at: Mapped[dt.datetime] = mapped_column()
    approved_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    approved_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    last_gates: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType, nullable=True)
    last_checked_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column()
    ended_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    end_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class ScheduledFlip(Base):
    """A canary flip to apply at ``run_at`` (None: as soon as it is approved).

    ``state``: ``pending_approval`` → ``scheduled`` → ``done`` | ``failed`` | ``cancelled`` |
    ``rejected``. ``if_version`` (flips that were asked for now) is the cohort version the
    request read; the flip is refused at approval when the cohort moved since. A flip at a
    time applies to whatever the cohort is then.
    """

    __tablename__ = "scheduled_flips"
    __table_args__ = (Index("ix_scheduled_flips_state", "state", "run_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cohort: Mapped[str] = mapped_column(String(64))
    enabled: Mapped[bool] = mapped_column(Boolean)
    percentage: Mapped[int | None] = mapped_column(Integer, nullable=True)
    run_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    if_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(24))
    version: Mapped[int] = mapped_column(Integer, default=1)
    reason: Mapped[str] = mapped_column(Text)
    requested_by: Mapped[str] = mapped_column(String(128))
    requester: Mapped[str] = mapped_column(String(128))
    requested_at: Mapped[dt.datetime] = mapped_column()
    approved_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    approved_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    done_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    result: Mapped[str | None] = mapped_column(Text, nullable=True)


class Webhook(Base):
    """A webhook subscription: events of ``kinds`` are POSTed to ``url``, signed with
    ``secret`` (HMAC-SHA256; kept as given, since signing needs it). Removing one keeps its
    row (``removed_at``) so that its outbox entries still name it."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(2048))
    secret: Mapped[str] = mapped_column(String(256))
    kinds: Mapped[list[str]] = mapped_column(JSONType)
    description: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[dt.datetime] = mapped_column()
    created_by: Mapped[str] = mapped_column(String(128))
    removed_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class OutboxEntry(Base):
    """One delivery of one event to one subscription, written in the transaction of the
    event itself. ``state``: ``pending`` → ``delivered`` | ``dead`` (after the last attempt;
    an admin may send it back to ``pending``). ``leased_until`` is when a delivery worker that
    took the entry gives it up if it has not recorded an outcome (a killed process)."""

    __tablename__ = "webhook_outbox"
    __table_args__ = (Index("ix_webhook_outbox_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(Integer, ForeignKey("webhooks.id"))
    delivery_id: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    state: Mapped[str] = mapped_column(String(16))
    num_attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column()
    next_attempt_at: Mapped[dt.datetime] = mapped_column()
    leased_until: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    last_attempt_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class AlertReceipt(Base):
    """One alert of Alertmanager's webhook as a receiver of ``TURNOUT_ALERTMANAGER_CONFIG``
    received it, once per firing: the key is (``receiver``, ``fingerprint``, ``starts_at``),
    so the repeats of a firing alert (every ``repeat_interval``, from each Alertmanager of an
    HA pair) find its receipt and act no more (``dashboard.store.alerts``).

    ``status`` is the alert's status when first received (``firing`` or ``resolved``);
    ``resolved_at`` its ``endsAt`` once a resolved notification came. ``action`` is the one
    its receiver's first matching rule names (None: no rule matched), ``cohort`` the stage it
    acted on, ``outcome`` what came of it (``acted``, ``no_change``, ``no_ramp``, ``no_stage``,
    ``unknown_stage``, ``no_rule``, ``resolved``) and ``audit_id`` the audit entry of an
    ``acted`` one.
    """

    __tablename__ = "alert_receipts"
    __table_args__ = (
        UniqueConstraint("receiver", "fingerprint", "starts_at", name="uq_alert_receipts_firing"),
        Index("ix_alert_receipts_received_at", "received_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    receiver: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))
    starts_at: Mapped[dt.datetime] = mapped_column()
    status: Mapped[str] = mapped_column(String(16))
    labels: Mapped[dict[str, Any]] = mapped_column(JSONType)
    generator_url: Mapped[str] = mapped_column(Text)
    action: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cohort: Mapped[str | None] = mapped_column(String(64), nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))
    audit_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    received_at: Mapped[dt.datetime] = mapped_column()
    resolved_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
