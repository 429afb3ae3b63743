"""The service's settings: the only reader of the environment (``TURNOUT_*`` variables).

Defaults give the embedded set-up of ``make run``: a SQLite file under ``./var/``, the shipped
``turnout`` policy pack, http://127.0.0.1:8000.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Service configuration; every field can be set as ``TURNOUT_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="TURNOUT_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///var/turnout.db",
        description="SQLAlchemy URL: a SQLite file (WAL mode) or postgresql+psycopg://...",
    )
    pack: str = Field(default="turnout", description="policy pack name or directory")
    host: str = "127.0.0.1"
    port: int = 8000
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
