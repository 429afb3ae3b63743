"""Initial schema: canaries, kill switch, audit log (append-only), decision events and their
roll-ups, API tokens, parity evidence, service facts.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from turnout.dashboard.store.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _decision_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pack", sa.String(64), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("runner", sa.String(8), nullable=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(64), nullable=True),
        sa.Column("reason_code", sa.String(32), nullable=False),
        sa.Column("rule_ids", JSON, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "canaries",
        sa.Column("cohort", sa.String(64), primary_key=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("percentage", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
    )
    op.create_table(
        "kill_switch",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("engaged", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("before", JSON, nullable=True),
        sa.Column("after", JSON, nullable=True),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_table(
        "decision_events",
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("deployment_id", sa.String(256), nullable=False),
        *_decision_columns(),
        sa.Column("policy_digest", sa.String(128), nullable=False),
        sa.Column("demo", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_decision_events_at", "decision_events", ["at"])
    op.create_index("ix_decision_events_deployment", "decision_events", ["deployment_id", "at"])
    op.create_index("ix_decision_events_family_runner", "decision_events", ["family", "runner"])
    op.create_table(
        "deployments",
        sa.Column("deployment_id", sa.String(256), primary_key=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        *_decision_columns(),
        sa.Column("config", JSON, nullable=True),
        sa.Column("demo", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_deployments_runner_family", "deployments", ["runner", "family"])
    op.create_table(
        "daily_decisions",
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("family", sa.String(64), primary_key=True),
        sa.Column("runner", sa.String(8), primary_key=True),
        sa.Column("reason_code", sa.String(32), primary_key=True),
        sa.Column("demo", sa.Boolean(), primary_key=True),
        sa.Column("num_events", sa.Integer(), nullable=False),
    )
    op.create_table(
        "daily_reasons",
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("family", sa.String(64), primary_key=True),
        sa.Column("rule_id", sa.String(128), primary_key=True),
        sa.Column("demo", sa.Boolean(), primary_key=True),
        sa.Column("num_events", sa.Integer(), nullable=False),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )
    op.create_table(
        "parity_evidence",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("runner_pair", sa.String(16), nullable=False),
        sa.Column("suite", sa.String(128), nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("recorded_by", sa.String(128), nullable=False),
    )
    op.create_index("ix_parity_evidence_family", "parity_evidence", ["family"])
    op.create_table(
        "service_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    _forbid_audit_changes()


def _forbid_audit_changes() -> None:
    """The audit log is append-only in the database itself, not only in the code."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )
        return
    for verb in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log "
            "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    for table in (
        "service_meta",
        "parity_evidence",
        "api_tokens",
        "daily_reasons",
        "daily_decisions",
        "deployments",
        "decision_events",
        "audit_log",
        "kill_switch",
        "canaries",
    ):
        op.drop_table(table)
