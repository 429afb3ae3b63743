"""The service's settings: the only reader of the environment (``TURNOUT_*`` variables).

Defaults give the embedded set-up of ``make run``: a SQLite file ``var/turnout.db`` in the source
checkout (whatever the working directory, so that ``turnout db`` and ``turnout demo`` run from
anywhere use the database ``make run`` serves), the shipped ``turnout`` policy pack,
http://127.0.0.1:8000.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import httpx
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from turnout.dashboard.egress import EgressPolicy
from turnout.dashboard.gates import GateConfig


def _checkout_root() -> Path | None:
    """The source checkout this package runs from (an editable install, as ``make run`` makes),
    or None for an installed copy (site-packages is no place for a database)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


CHECKOUT_ROOT = _checkout_root()


def default_sqlite_path() -> Path:
    """The default database file, an absolute path: ``<checkout>/var/turnout.db`` in a source
    checkout, else ``$XDG_DATA_HOME/turnout/turnout.db`` (``~/.local/share/turnout/…`` when
    ``XDG_DATA_HOME`` is unset, empty or relative: the XDG Base Directory specification says to
    ignore a relative one, which would name another database in every working directory)."""
    if CHECKOUT_ROOT is not None:
        return CHECKOUT_ROOT / "var" / "turnout.db"
    data_home = Path(os.environ.get("XDG_DATA_HOME", ""))
    if not data_home.is_absolute():
        data_home = Path.home() / ".local" / "share"
    return data_home.resolve() / "turnout" / "turnout.db"


def default_database_url() -> str:
    return f"sqlite:///{default_sqlite_path()}"


class Settings(BaseSettings):
    """Service configuration; every field can be set as ``TURNOUT_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="TURNOUT_", extra="ignore")

    database_url: str = Field(
        default_factory=default_database_url,
        description="SQLAlchemy URL: a SQLite file (WAL mode) or postgresql+psycopg://...; "
        "default: var/turnout.db of the source checkout, an absolute path (a relative "
        "sqlite:///path given here is relative to the working directory)",
    )
    pack: str = Field(default="turnout", description="policy pack name or directory")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535, description="the TCP port to listen on")
    demo: bool = Field(default=True, description="seed the demo fleet on an empty database")
    snapshot_ttl_s: float = Field(
        default=1.0,
        ge=0.0,
        description="how long a process serves its in-memory canary snapshot before re-reading "
        "the store (bounds how late another replica's flip is seen by /decide)",
    )
    token_cache_ttl_s: float = Field(
        default=5.0, ge=0.0, description="how long a verified token is trusted without a lookup"
    )
    sqlite_synchronous: str = Field(
        default="NORMAL",
        pattern="^(NORMAL|FULL)$",
        description="NORMAL survives a killed process (WAL); FULL also survives power loss",
    )
    log_level: str = "info"
    hub_online: bool = Field(
        default=False,
        description="resolve the model ids of requests through the HF hub (HF_ENDPOINT); off: "
        "the local HF cache and policies/known_models.yaml only, so a slow hub cannot hold "
        "the threads that answer requests",
    )

    max_clock_skew_s: float = Field(
        default=300.0,
        ge=0.0,
        description="how far ahead of the service's clock a reported decision's `at` may lie "
        "(a later one is refused: it would pin the deployment's latest state until then)",
    )
    max_config_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="the largest `config` of a reported decision, as compact JSON, that is "
        "stored (a larger one is refused)",
    )
    session_ttl_s: float = Field(
        default=12 * 3600.0,
        ge=60.0,
        description="how long a page sign-in lasts (the session ends then, or at sign-out, or "
        "when its token is revoked or expires)",
    )
    health_metrics_window_s: float = Field(
        default=900.0,
        gt=0.0,
        description="the engine-health gauges of /metrics aggregate the reports whose window "
        "ended this many seconds ago or later",
    )
    https: bool = Field(
        default=False,
        description="the service is reached over HTTPS (directly or behind a TLS proxy): the "
        "sign-in cookies are Secure and responses carry Strict-Transport-Security",
    )

    require_approval: bool = Field(
        default=False,
        description="a change that sends more of a cohort to V2 (enable, a larger share, a "
        "ramp, a scheduled enable) waits until another operator approves it",
    )
    background: bool = Field(
        default=True,
        description="run the ramp ticker (ramps, scheduled flips) and the webhook delivery "
        "worker in the service (every replica may: they take turns through row locks)",
    )
    prometheus_url: str | None = Field(
        default=None,
        description="the fleet's Prometheus (http://prometheus:9090), which ramps' PromQL "
        "gates query; unset: a PromQL gate is inconclusive",
    )

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url(cls, url: str | None) -> str | None:
        """A URL the gates can ask (refused at start-up rather than at every ticker pass)."""
        if not url:
            return None
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL of a Prometheus")
        try:
            httpx.URL(url)
        except (httpx.InvalidURL, ValueError) as err:
            raise ValueError(f"{url!r} is not a URL: {err}") from None
        return url

    @field_validator("prometheus_authorization")
    @classmethod
    def _header_value(cls, value: SecretStr | None) -> SecretStr | None:
        text = value.get_secret_value() if value is not None else ""
        if value is not None and not re.fullmatch(r"[\x21-\x7e]+( [\x21-\x7e]+)*", text):
            raise ValueError("must be a printable ASCII header value ('Bearer <token>')")
        return value

    prometheus_timeout_s: float = Field(
        default=5.0, gt=0.0, le=120.0, description="seconds one PromQL gate query may take"
    )
    prometheus_authorization: SecretStr | None = Field(
        default=None,
        description="the Authorization header value Prometheus needs (e.g. 'Bearer <token>')",
    )
    engine_ttl_s: float = Field(
        default=90.0,
        ge=1.0,
        le=86_400.0,
        description="a registered engine whose last heartbeat is older than this many seconds "
        "drops out of Prometheus' targets and of the list of engines on an old decision "
        "(engines send one every 15 s by default)",
    )
    tick_s: float = Field(
        default=5.0, ge=0.05, le=3600.0, description="seconds between two passes of the ramp ticker"
    )
    ramp_gates: GateConfig = Field(
        default_factory=GateConfig,
        description="the gate thresholds a ramp gets when its request names none (JSON; a "
        "field left out keeps GateConfig's default, e.g. "
        '{"min_engines": 3, "evidence_max_age_s": 86400})',
    )
    webhook_poll_s: float = Field(
        default=1.0,
        ge=0.05,
        le=3600.0,
        description="seconds between two passes of the delivery worker over the outbox",
    )
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=100, description="attempts of a delivery before it is dead"
    )
    webhook_backoff_s: float = Field(
        default=5.0,
        ge=0.01,
        le=86_400.0,
        description="the wait after a first failed attempt; it "
        "doubles with each further one (with jitter)",
    )
    webhook_max_backoff_s: float = Field(
        default=3600.0,
        ge=0.01,
        le=7 * 86_400.0,
        description="the longest wait between two attempts",
    )
    webhook_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=300.0,
        description="how long one attempt waits for the receiver's answer, in all",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        le=3600.0,
        description="seconds a request's line and headers may take to arrive (from its first "
        "byte, or the connection's opening); the connection is closed after, with a 408 "
        "(dashboard/http_timeouts.py)",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0.0,
        le=3600.0,
        description="seconds a request's body may take to arrive once its headers are in",
    )
    max_heavy_reads: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="CSV exports and upgrade previews that may run at once in a process; one "
        "more is answered 429 with Retry-After (dashboard/heavy_reads.py)",
    )
    max_heavy_reads_per_token: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="of those, how many one token may run at once",
    )
    switch_interval_ms: float = Field(
        default=1.0,
        gt=0.0,
        le=100.0,
        description="how often (ms) a Python thread running hot hands the interpreter lock to "
        "another (sys.setswitchinterval; Python's default is 5): a request waiting behind "
        "exports and previews on worker threads waits a few of these at each step",
    )
    freeze_heap: bool = Field(
        default=True,
        description="once started, `turnout serve` moves every object alive into the garbage "
        "collector's permanent generation (gc.freeze, as vLLM's freeze_gc_heap does after "
        "start-up, vllm/utils/gc_utils.py since 0.11.1): a full collection then scans only what "
        "requests made, not the pack, the oracle's tables and the libraries",
    )
    webhook_allow_networks: str = Field(
        default="",
        max_length=4096,
        description="networks or addresses webhooks may go to beyond the public ones, "
        "comma-separated (127.0.0.0/8, 10.1.2.3, fd00::/8): loopback, link-local, private "
        "and metadata addresses are refused otherwise (dashboard/egress.py)",
    )
    alertmanager_config: Path | None = Field(
        default=None,
        description="a YAML file of Alertmanager receivers (their tokens and rules) that "
        "POST /api/v1/alertmanager accepts alerts from (dashboard/alertmanager.py); none: "
        "no receiver, every alert is refused",
    )
    webhook_lease_s: float = Field(
        default=60.0,
        ge=1.0,
        le=86_400.0,
        description="how long a worker holds a delivery it took "
        "before another may take it (a killed process); at "
        "least twice webhook_timeout_s is used",
    )

    @field_validator("webhook_allow_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        EgressPolicy.parse(value)  # a ValueError names the entry
        return value

    @property
    def egress(self) -> EgressPolicy:
        """Where webhooks may go (``webhook_allow_networks`` beyond the public addresses)."""
        return EgressPolicy.parse(self.webhook_allow_networks)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def sqlite_path(self) -> Path | None:
        """The database file of a ``sqlite:///`` URL (None for in-memory or other backends)."""
        if not self.is_sqlite:
            return None
        _, _, rest = self.database_url.partition(":///")
        path = rest.split("?", 1)[0]
        return Path(path) if path and path != ":memory:" else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
