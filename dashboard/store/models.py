"""Tables of the rollout-control store (SQLAlchemy 2 typed declarative models).

Times are timezone-aware UTC (``UTCDateTime``). The schema itself is created by the Alembic
migrations in ``dashboard/migrations``; these models must match them (a test compares).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# none_as_null: Python None is SQL NULL (not the JSON literal null), so IS NULL filters work.
JSONType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored as UTC and always read back timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware time")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        assert isinstance(value, dt.datetime)
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dt.datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
    }


class Canary(Base):
    """The canary state of one rollout cohort (a stage of the pack's rollout.yaml)."""

    __tablename__ = "canaries"

    cohort: Mapped[str] = mapped_column(String(64), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean)
    percentage: Mapped[int] = mapped_column(Integer, default=100)
    # Optimistic concurrency: a flip names the version it read (If-Match) and bumps it.
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_by: Mapped[str] = mapped_column(String(128), default="pack defaults")


class KillSwitch(Base):
    """The global kill switch (one row, id 1): engaged sends every auto deployment to V1."""

    __tablename__ = "kill_switch"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    engaged: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_by: Mapped[str] = mapped_column(String(128), default="pack defaults")


class AuditEntry(Base):
    """One change, append-only: the migrations install triggers that refuse UPDATE and DELETE."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)


class DecisionFields:
    """The columns a decision event and a deployment's latest decision share."""

    at: Mapped[dt.datetime] = mapped_column()
    host: Mapped[str] = mapped_column(String(256), default="")
    pack: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(64))
    runner: Mapped[str | None] = mapped_column(String(8), nullable=True)
    mode: Mapped[str] = mapped_column(String(16))
    stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason_code: Mapped[str] = mapped_column(String(32))
    rule_ids: Mapped[list[str]] = mapped_column(JSONType)


class DecisionEvent(DecisionFields, Base):
    """One decision an engine made at start-up, as reported (idempotent by ``event_id``)."""

    __tablename__ = "decision_events"
    # One index besides the key: every further one costs a random page write per event at
    # ingest (migration 0002 says how much).
    __table_args__ = (Index("ix_decision_events_at", "at"),)

    event_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment_id: Mapped[str] = mapped_column(String(256))
    policy_digest: Mapped[str] = mapped_column(String(128), default="")
    demo: Mapped[bool] = mapped_column(Boolean, default=False)
    # How ``turnout launch`` started vLLM with the decision (``oracle.wire.LaunchIn`` without
    # its ``startup``), None for an engine's own decision; migration 0007.
    launch: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    # vLLM's start-up line, attached when its follow-up event arrives: ``{"runner", "line",
    # "at", "event_id"}`` (``dashboard/store/launches.py``); migration 0007.
    startup: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)


class Deployment(DecisionFields, Base):
    """The latest decision of each deployment (kept at ingest; the fleet view and aggregates)."""

    __tablename__ = "deployments"
    # No index besides the key: ingest moves rows on every report, and the counts by runner,
    # family and reason are ``latest_counts`` (migration 0004).

    deployment_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(64))
    # Stored so the impact preview can re-decide the deployment under a hypothetical flip.
    config: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    demo: Mapped[bool] = mapped_column(Boolean, default=False)


class DailyDecisions(Base):
    """Events per day x family x runner x reason code (rolled up at ingest)."""

    __tablename__ = "daily_decisions"

    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    family: Mapped[str] = mapped_column(String(64), primary_key=True)
    runner: Mapped[str] = mapped_column(String(8), primary_key=True)  # "" when no runner
    reason_code: Mapped[str] = mapped_column(String(32), primary_key=True)
    demo: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    num_events: Mapped[int] = mapped_column(Integer)


class LatestCounts(Base):
    """Deployments by their latest decision, per time bucket of that decision (kept at ingest,
    in the ingest's transaction; ``dashboard/store/latest_counts.py``).

    Each deployment is counted once with ``reason = ""`` (the deployment itself: its runner,
    and for a fallback the kind of what holds it back) and, when its latest decision is not
    V2, once per fallback-reason key (``latest_counts.reason_keys``). Buckets of four sizes
    (``bucket_s``: 300, 3600, 21600, 86400 seconds; ``bucket``: epoch seconds, UTC) let a time window
    be summed from a few rows whatever the number of events or deployments.
    """

    __tablename__ = "latest_counts"
    # SQLite: the key is the table (no rowid b-tree beside it).
    __table_args__ = ({"sqlite_with_rowid": False},)

    bucket_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    reason: Mapped[str] = mapped_column(String(128), primary_key=True)  # "" = the deployment
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)  # blocked|waiting|held|""
    family: Mapped[str] = mapped_column(String(64), primary_key=True)
    stage: Mapped[str] = mapped_column(String(64), primary_key=True)  # "" when in no stage
    pack: Mapped[str] = mapped_column(String(64), primary_key=True)
    runner: Mapped[str] = mapped_column(String(8), primary_key=True)  # "" when no runner
    demo: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    num_deployments: Mapped[int] = mapped_column(Integer)


class EngineHealth(Base):
    """One engine's health over one window, as reported (``POST /api/v1/health``, idempotent
    by ``report_id``; ``oracle.wire.HealthReportIn``). Aggregated by ``store/health.py``."""

    __tablename__ = "engine_health"
    # What the aggregates read: one stage's reports in a time range, and every stage's in a
    # recent range (/metrics, the page's choice of stage).
    __table_args__ = (
        Index("ix_engine_health_stage_end_s", "stage", "end_s"),
        Index("ix_engine_health_end_s", "end_s"),
    )

    report_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment_id: Mapped[str] = mapped_column(String(256))
    host: Mapped[str] = mapped_column(String(256), default="")
    pack: Mapped[str] = mapped_column(String(64))
    runner: Mapped[str] = mapped_column(String(8))
    family: Mapped[str] = mapped_column(String(64))
    stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    window_start: Mapped[dt.datetime] = mapped_column()
    window_end: Mapped[dt.datetime] = mapped_column()
    # window_end in epoch seconds (UTC): time buckets and ranges as integer arithmetic, the
    # same SQL on SQLite and PostgreSQL.
    end_s: Mapped[int] = mapped_column(BigInteger)
    num_requests: Mapped[int] = mapped_column(Integer)
    num_errors: Mapped[int] = mapped_column(Integer)
    num_crashes: Mapped[int] = mapped_column(Integer)
    ttft_p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    num_output_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens_per_s: Mapped[float] = mapped_column(Float)
    received_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Engine(Base):
    """A serving engine that registered (``PUT /api/v1/engines/{engine_id}``,
    ``oracle.wire.EngineIn``): where Prometheus scrapes it, the decision it runs and when it
    last said it lives (each registration repeats as a heartbeat). ``ended_at`` is set by its
    clean exit (``DELETE``); an engine that stops without one drops out of the live list when
    its heartbeat is older than the service's ``engine_ttl_s``. Read by
    ``dashboard/store/engines.py``."""

    __tablename__ = "engines"
    __table_args__ = (Index("ix_engines_last_seen_at", "last_seen_at"),)

    engine_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment_id: Mapped[str] = mapped_column(String(256))
    host: Mapped[str] = mapped_column(String(256), default="")
    address: Mapped[str] = mapped_column(String(300))
    scheme: Mapped[str] = mapped_column(String(8))
    metrics_path: Mapped[str] = mapped_column(String(256))
    engine: Mapped[str] = mapped_column(String(16))  # turnout | vllm
    vllm_version: Mapped[str] = mapped_column(String(64))
    pack: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(64))
    stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    runner: Mapped[str] = mapped_column(String(8))
    mode: Mapped[str] = mapped_column(String(8))
    cohort: Mapped[str] = mapped_column(String(16))  # canary | baseline
    policy_digest: Mapped[str] = mapped_column(String(128), default="")
    config: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    registered_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class ApiToken(Base):
    """A bearer token, stored as its SHA-256 (the token itself is shown once, at creation)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128))
    revoked_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    # None: never expires (tokens made before migration 0003, or without --expires-in)
    expires_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class PageSession(Base):
    """A signed-in page session: the cookie holds a random id, this table its SHA-256 (the
    API token is never in the cookie). It ends at ``expires_at``, at sign-out (``ended_at``),
    or when its token is revoked or expires."""

    __tablename__ = "page_sessions"
    __table_args__ = (Index("ix_page_sessions_token_id", "token_id"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer, ForeignKey("api_tokens.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column()
    ended_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class ParityEvidence(Base):
    """A parity-suite result for a family on a runner pair (what backs a canary flip)."""

    __tablename__ = "parity_evidence"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    family: Mapped[str] = mapped_column(String(64), index=True)
    runner_pair: Mapped[str] = mapped_column(String(16))  # "v1:v2"
    suite: Mapped[str] = mapped_column(String(128))
    result: Mapped[str] = mapped_column(String(16))  # pass | fail
    details: Mapped[str] = mapped_column(Text, default="")
    recorded_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    recorded_by: Mapped[str] = mapped_column(String(128))
    # The test counts of the run (a JUnit report's; migration 0006), None when not given.
    num_tests: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_failures: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_errors: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_skipped: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ServiceMeta(Base):
    """Small facts about this database (``demo_seeded``...)."""

    __tablename__ = "service_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


# The closed-loop tables share this metadata (the migrations and their check read it).
from turnout.dashboard.store import models_rollout as _models_rollout  # noqa: E402, F401
