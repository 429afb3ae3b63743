"""Serving engines that registered with the service (``engines``: one row per engine process,
``PUT /api/v1/engines/{engine_id}``, repeated as its heartbeat): the targets of Prometheus'
HTTP service discovery and the list of engines still on an old decision
(``dashboard/store/engines.py``). One index besides the key, on ``last_seen_at``: the live
list is the rows seen since a cut-off.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from turnout.dashboard.store.models import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.create_table(
        "engines",
        sa.Column("engine_id", sa.String(64), primary_key=True),
        sa.Column("deployment_id", sa.String(256), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("address", sa.String(300), nullable=False),
        sa.Column("scheme", sa.String(8), nullable=False),
        sa.Column("metrics_path", sa.String(256), nullable=False),
        sa.Column("engine", sa.String(16), nullable=False),
        sa.Column("vllm_version", sa.String(64), nullable=False),
        sa.Column("pack", sa.String(64), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("stage", sa.String(64), nullable=True),
        sa.Column("runner", sa.String(8), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("cohort", sa.String(16), nullable=False),
        sa.Column("policy_digest", sa.String(128), nullable=False),
        sa.Column("config", JSON, nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_engines_last_seen_at", "engines", ["last_seen_at"])


def downgrade() -> None:
    op.drop_index("ix_engines_last_seen_at", table_name="engines")
    op.drop_table("engines")
