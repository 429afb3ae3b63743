"""Server-side page sessions and expiring API tokens.

``page_sessions`` holds the SHA-256 of each signed-in page session's random id (the cookie
held the API token itself before), with its token, expiry and sign-out time;
``api_tokens.expires_at`` is when a token stops being accepted (NULL: never, as every token
made before this revision).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from turnout.dashboard.store.models import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", UTCDateTime(), nullable=True))
    op.create_table(
        "page_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("token_id", sa.Integer(), sa.ForeignKey("api_tokens.id"), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_page_sessions_token_id", "page_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_page_sessions_token_id", table_name="page_sessions")
    op.drop_table("page_sessions")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")
