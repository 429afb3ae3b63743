"""Deployments counted by their latest decision per time bucket (``latest_counts``), kept at
ingest so that the fallback-reasons page and API read a few hundred rows whatever the number
of stored events; backfilled here from ``deployments`` (each deployment's latest decision).

``daily_reasons`` (fallback *events* per day and reason) goes: the page's time chart now
counts the deployments its table counts, from ``latest_counts``, and nothing read the events
roll-up any more (keeping it cost an upsert per batch and reason at ingest). A downgrade
brings the table back empty. So does the index of ``deployments`` by (runner, family): the
counts it served are ``latest_counts`` now, and it cost index writes on every report.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "latest_counts",
        sa.Column("bucket_s", sa.Integer(), primary_key=True),
        sa.Column("bucket", sa.BigInteger(), primary_key=True),
        sa.Column("reason", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("family", sa.String(64), primary_key=True),
        sa.Column("stage", sa.String(64), primary_key=True),
        sa.Column("pack", sa.String(64), primary_key=True),
        sa.Column("runner", sa.String(8), primary_key=True),
        sa.Column("demo", sa.Boolean(), primary_key=True),
        sa.Column("num_deployments", sa.Integer(), nullable=False),
        sqlite_with_rowid=False,
    )
    # The backfill is the store's own rebuild (the code that ingest keeps the table with), so
    # that a backfilled table and one kept from the first event are the same.
    from turnout.dashboard.store.latest_counts import rebuild

    rebuild(op.get_bind())
    op.drop_table("daily_reasons")
    op.drop_index("ix_deployments_runner_family", table_name="deployments")


def downgrade() -> None:
    op.drop_table("latest_counts")
    op.create_index("ix_deployments_runner_family", "deployments", ["runner", "family"])
    op.create_table(
        "daily_reasons",
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("family", sa.String(64), primary_key=True),
        sa.Column("rule_id", sa.String(128), primary_key=True),
        sa.Column("demo", sa.Boolean(), primary_key=True),
        sa.Column("num_events", sa.Integer(), nullable=False),
    )
