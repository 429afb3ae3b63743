"""Alertmanager's alerts as the service received them (``POST /api/v1/alertmanager``): one row
per receiver and firing, unique on (receiver, fingerprint, startsAt), so that the repeats of
a firing alert, and the copy the second Alertmanager of an HA pair sends, act no more
(``dashboard/store/alerts.py``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from turnout.dashboard.store.models import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "alert_receipts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("receiver", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("starts_at", UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("generator_url", sa.Text(), nullable=False),
        sa.Column("action", sa.String(16), nullable=True),
        sa.Column("cohort", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("audit_id", sa.Integer(), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("resolved_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint(
            "receiver", "fingerprint", "starts_at", name="uq_alert_receipts_firing"
        ),
    )
    op.create_index("ix_alert_receipts_received_at", "alert_receipts", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_alert_receipts_received_at", table_name="alert_receipts")
    op.drop_table("alert_receipts")
