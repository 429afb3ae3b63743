"""Engine and sessions: SQLite (WAL, ``BEGIN IMMEDIATE`` for writes) or PostgreSQL by URL, and
Alembic upgrades (applied on start-up and by ``turnout db upgrade``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from turnout.dashboard.store.errors import DatabaseUnavailable

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
# Serialises concurrent upgrades of one PostgreSQL database by several replicas.
_PG_MIGRATION_LOCK = 7_423_001
# Serialises the other start-up writes (canary defaults, demo fleet, first admin token).
_PG_STARTUP_LOCK = 7_423_002


class Database:
    """One database: a read session factory and a write one.

    On SQLite, write transactions start with ``BEGIN IMMEDIATE`` so that concurrent writers wait
    on ``busy_timeout`` instead of failing when a read snapshot turns stale; on PostgreSQL both
    factories are the same (row locks and conditional updates give the ordering).
    """

    def __init__(self, url: str, *, sqlite_synchronous: str = "NORMAL", echo: bool = False):
        """Raises DatabaseUnavailable: ``url`` is not a database URL, or the directory of its
        SQLite file cannot be made (created when missing)."""
        self.url = url
        try:
            sa_url = make_url(url)
            self.is_sqlite = sa_url.get_backend_name() == "sqlite"
            kwargs: dict[str, Any] = {"echo": echo}
            if self.is_sqlite:
                if sa_url.database and sa_url.database != ":memory:":
                    _make_parent(Path(sa_url.database))
                kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            else:
                kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
            self.engine: Engine = create_engine(url, **kwargs)
        except ArgumentError as err:  # NoSuchModuleError (an unknown dialect) included
            raise DatabaseUnavailable(
                f"{_safe(url)!r} is not a database URL: use sqlite:///path/to/file.db or "
                "postgresql+psycopg://user@host/db"
            ) from err
        if self.is_sqlite:
            _install_sqlite_hooks(self.engine, sqlite_synchronous)
            writer: Engine = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        else:
            writer = self.engine
        self.read_session = sessionmaker(self.engine, expire_on_commit=False)
        self.write_session = sessionmaker(writer, expire_on_commit=False)

    def check(self) -> None:
        """Open one connection, so that a database that cannot be used says so before any work.

        Raises:
            DatabaseUnavailable: the server refuses or is not there, the database does not
                exist, the SQLite file cannot be opened.
        """
        try:
            with self.engine.connect():
                pass
        except OperationalError as err:
            reason = str(err.orig or err).strip().splitlines()[0]
            raise DatabaseUnavailable(
                f"cannot connect to the database {_safe(self.url)}: {reason}"
            ) from err

    def upgrade(self) -> None:
        """Apply every pending Alembic migration (idempotent; safe with several replicas).

        A database already at the shipped head is left alone without loading the migration
        scripts or taking the migration lock (each start-up and each ``turnout`` command that
        opens the store begins here)."""
        if self.current_revision() == shipped_head():
            return
        with self.engine.begin() as conn:
            if not self.is_sqlite:
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
            cfg = alembic_config(self.url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def lock_startup(self, session: Session) -> None:
        """Serialise a start-up write (check, then insert) with the same write of replicas
        starting at once: on PostgreSQL an advisory lock held until the session's transaction
        ends (two replicas both inserting the canary defaults made one fail to start); SQLite's
        write transactions (``BEGIN IMMEDIATE``) are exclusive already."""
        if not self.is_sqlite:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_STARTUP_LOCK})

    def current_revision(self) -> str | None:
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def dispose(self) -> None:
        self.engine.dispose()


def _safe(url: str) -> str:
    """``url`` without its password (as given when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, no permission, a read-only file system
        raise DatabaseUnavailable(
            f"cannot create the directory of the SQLite database {path.parent}: "
            f"{err.strerror or err}"
        ) from err


@functools.cache
def shipped_head() -> str | None:
    """The head revision of the shipped migrations (read from their scripts once a process)."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def alembic_config(url: str) -> Config:
    """An Alembic configuration for ``url`` pointing at the shipped migrations."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _install_sqlite_hooks(engine: Engine, synchronous: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook below emit BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL loses nothing when the process is killed, only on power loss.
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=30000")
        # 32 MiB of page cache (default 2 MiB): the indexes of a million events stay in memory.
        cur.execute("PRAGMA cache_size=-32768")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


def session_scope(factory: sessionmaker[Session]) -> Session:
    """A new session (use as a context manager: ``with session_scope(db.write_session) as s``)."""
    return factory()
