"""Decision events keep their ``launch`` part (how ``turnout launch`` started vLLM) and vLLM's
start-up line (``startup``, attached when its follow-up event arrives); the follow-up events
that earlier revisions stored as decisions of their own are folded into their decisions
(``dashboard/store/launch_fold.py``), so that the day counts and ``latest_counts`` count each
start once.

Both columns are added in place (``ALTER TABLE ... ADD COLUMN``, also on SQLite: no copy of
the events table). A downgrade drops them; the folded rows stay folded.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
COLUMNS = ("launch", "startup")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("decision_events", sa.Column(name, JSON, nullable=True))
    from turnout.dashboard.store.launch_fold import fold_follow_ups

    fold_follow_ups(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("decision_events") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
