"""Drop two indexes of decision_events that cost more at ingest than they save at read time.

Each event touched a random page of ``(deployment_id, at)`` and of ``(family, runner)``; at 500
events a batch that doubled the pages a commit writes (measured with benchmarks/service_load.py:
~44 -> ~29 us of CPU an event at 200,000 stored events). The pages read recent events through
the ``at`` index with filters; a deployment's latest decision is the ``deployments`` table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_decision_events_deployment", table_name="decision_events")
    op.drop_index("ix_decision_events_family_runner", table_name="decision_events")


def downgrade() -> None:
    op.create_index("ix_decision_events_family_runner", "decision_events", ["family", "runner"])
    op.create_index("ix_decision_events_deployment", "decision_events", ["deployment_id", "at"])
