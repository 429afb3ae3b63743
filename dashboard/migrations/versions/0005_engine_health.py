"""Runtime health reported by engines (``engine_health``: one row per engine and window,
``POST /api/v1/health``), read by the health page, ``GET /api/v1/health``, ``/metrics`` and the
rollout's gates through ``dashboard/store/health.py``. Two indexes besides the key: (stage,
end_s) for one stage's reports in a time range, (end_s) for every stage's in a recent one.
Reports come about once a minute per engine, so the second index costs ingest little.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from turnout.dashboard.store.models import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "engine_health",
        sa.Column("report_id", sa.String(64), primary_key=True),
        sa.Column("deployment_id", sa.String(256), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pack", sa.String(64), nullable=False),
        sa.Column("runner", sa.String(8), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("stage", sa.String(64), nullable=True),
        sa.Column("window_start", UTCDateTime(), nullable=False),
        sa.Column("window_end", UTCDateTime(), nullable=False),
        sa.Column("end_s", sa.BigInteger(), nullable=False),
        sa.Column("num_requests", sa.Integer(), nullable=False),
        sa.Column("num_errors", sa.Integer(), nullable=False),
        sa.Column("num_crashes", sa.Integer(), nullable=False),
        sa.Column("ttft_p50_ms", sa.Float(), nullable=True),
        sa.Column("ttft_p99_ms", sa.Float(), nullable=True),
        sa.Column("tpot_p50_ms", sa.Float(), nullable=True),
        sa.Column("tpot_p99_ms", sa.Float(), nullable=True),
        sa.Column("num_output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens_per_s", sa.Float(), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_engine_health_stage_end_s", "engine_health", ["stage", "end_s"])
    op.create_index("ix_engine_health_end_s", "engine_health", ["end_s"])


def downgrade() -> None:
    op.drop_index("ix_engine_health_end_s", table_name="engine_health")
    op.drop_index("ix_engine_health_stage_end_s", table_name="engine_health")
    op.drop_table("engine_health")
