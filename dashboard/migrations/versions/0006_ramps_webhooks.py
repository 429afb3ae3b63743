"""The closed rollout loop: ramps with gates, scheduled flips and their approvals, webhook
subscriptions and the persistent webhook outbox; parity evidence keeps a run's test counts.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from turnout.dashboard.store.models import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
COUNTS = ("num_tests", "num_failures", "num_errors", "num_skipped")


def _requested() -> list[sa.Column[object]]:
    """Who asked, and who approved (the two-person rule)."""
    return [
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("requester", sa.String(128), nullable=False),
        sa.Column("requested_at", UTCDateTime(), nullable=False),
        sa.Column("approved_by", sa.String(128), nullable=True),
        sa.Column("approved_at", UTCDateTime(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "ramps",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("cohort", sa.String(64), nullable=False),
        sa.Column("state", sa.String(24), nullable=False),
        sa.Column("steps", JSON, nullable=False),
        sa.Column("gates", JSON, nullable=False),
        sa.Column("on_failure", sa.String(16), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("step_started_at", UTCDateTime(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("if_version", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        *_requested(),
        sa.Column("last_gates", JSON, nullable=True),
        sa.Column("last_checked_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_ramps_cohort_state", "ramps", ["cohort", "state"])
    op.create_table(
        "scheduled_flips",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("cohort", sa.String(64), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("percentage", sa.Integer(), nullable=True),
        sa.Column("run_at", UTCDateTime(), nullable=True),
        sa.Column("if_version", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(24), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        *_requested(),
        sa.Column("done_at", UTCDateTime(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
    )
    op.create_index("ix_scheduled_flips_state", "scheduled_flips", ["state", "run_at"])
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("secret", sa.String(256), nullable=False),
        sa.Column("kinds", JSON, nullable=False),
        sa.Column("description", sa.String(256), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("removed_at", UTCDateTime(), nullable=True),
    )
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("webhook_id", sa.Integer(), sa.ForeignKey("webhooks.id"), nullable=False),
        sa.Column("delivery_id", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("num_attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("leased_until", UTCDateTime(), nullable=True),
        sa.Column("last_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_webhook_outbox_due", "webhook_outbox", ["state", "next_attempt_at"])
    with op.batch_alter_table("parity_evidence") as batch:
        for name in COUNTS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("parity_evidence") as batch:
        for name in COUNTS:
            batch.drop_column(name)
    op.drop_index("ix_webhook_outbox_due", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
    op.drop_table("webhooks")
    op.drop_index("ix_scheduled_flips_state", table_name="scheduled_flips")
    op.drop_table("scheduled_flips")
    op.drop_index("ix_ramps_cohort_state", table_name="ramps")
    op.drop_table("ramps")
