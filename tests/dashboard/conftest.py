"""Fixtures of the service tests: a fresh database per test on SQLite and on the local
PostgreSQL (one schema per test, dropped afterwards), a built app with tokens of every role."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser_helpers
import pytest
from service_helpers import Api, LiveService, role_tokens

PG_BASE = os.environ.get("TURNOUT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_available() -> str | None:
    """None when the server answers, else why not."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(_libpq(PG_BASE), connect_timeout=3):
            return None
    except psycopg.OperationalError as exc:
        return f"no PostgreSQL server answers at {PG_BASE}: {str(exc).strip()}"


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


_PG_SKIP = _pg_available()


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A URL whose search_path is a fresh schema in database ``test``; dropped afterwards."""
    if _PG_SKIP:
        pytest.skip(_PG_SKIP)
    import psycopg

    schema = f"turnout_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(PG_BASE), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_BASE}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_libpq(PG_BASE), autocommit=True) as conn:
            # Close connections a test left behind (a killed service process), then drop.
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND query ILIKE %s",
                (f"%{schema}%",),
            )
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


class _ReusedSchema:
    """One migrated PostgreSQL schema per test process, emptied before each test that takes it:
    migrating a fresh schema per test cost about 0.2 s of the test's set-up. A test that changes
    the schema itself (a downgrade, a dropped table) makes the next test get a new one."""

    def __init__(self) -> None:
        self.name = ""
        self.shape: list[tuple[Any, ...]] = []
        self.num_taken = 0

    @property
    def url(self) -> str:
        # application_name marks this schema's connections, so that those a test left behind
        # (a service killed with -9) can be closed before the next test empties the tables.
        # It also makes each test's URL its own, as a fresh schema's was: the store keeps
        # small per-database memos by URL (latest_counts' hourly prune).
        return (
            f"{PG_BASE}?options=-csearch_path%3D{self.name}"
            f"&application_name={self.name}.{self.num_taken}"
        )

    def _shape(self, conn: Any) -> list[tuple[Any, ...]]:
        return [
            *conn.execute(
                "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), "
                "a.attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
                "JOIN pg_class c ON c.oid = a.attrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'i', 'S') AND a.attnum > 0 "
                "AND NOT a.attisdropped ORDER BY 1, 2",
                (self.name,),
            ),
            *conn.execute(
                "SELECT tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                "AND NOT t.tgisinternal ORDER BY 1",
                (self.name,),
            ),
            *conn.execute(f'SELECT version_num FROM "{self.name}".alembic_version'),
        ]

    def _create(self, conn: Any) -> None:
        from turnout.dashboard.store.db import Database

        self.name = f"turnout_t_{uuid.uuid4().hex[:12]}"
        conn.execute(f'CREATE SCHEMA "{self.name}"')
        db = Database(self.url)
        db.upgrade()
        db.dispose()
        self.shape = self._shape(conn)

    def _drop(self, conn: Any) -> None:
        self._close_connections(conn)
        conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')

    def _close_connections(self, conn: Any) -> None:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND application_name LIKE %s",
            (f"{self.name}.%",),
        )

    def take(self) -> str:
        """The schema's URL, its tables empty and its sequences restarted."""
        import psycopg

        with psycopg.connect(_libpq(PG_BASE), autocommit=True) as conn:
            if self.name:
                self._close_connections(conn)
                try:
                    intact = self._shape(conn) == self.shape
                except psycopg.Error:
                    intact = False
                if not intact:
                    self._drop(conn)
                    self.name = ""
            if not self.name:
                self._create(conn)
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s "
                    "AND tablename <> 'alembic_version'",
                    (self.name,),
                )
            ]
            sequences = [
                r[0]
                for r in conn.execute(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (self.name,)
                )
            ]
            with conn.transaction():
                # Triggers off for this transaction: the audit log's append-only trigger, and
                # the foreign keys' (so the order of the deletes does not matter).
                conn.execute("SET LOCAL session_replication_role = replica")
                for table in tables:
                    conn.execute(f'DELETE FROM "{self.name}"."{table}"')
                for sequence in sequences:
                    conn.execute(f'ALTER SEQUENCE "{self.name}"."{sequence}" RESTART')
        self.num_taken += 1
        return self.url

    def close(self) -> None:
        if not self.name:
            return
        import psycopg

        with psycopg.connect(_libpq(PG_BASE), autocommit=True) as conn:
            self._drop(conn)


@pytest.fixture(scope="session")
def _reused_pg_schema() -> Iterator[_ReusedSchema]:
    schema = _ReusedSchema()
    yield schema
    schema.close()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, copied for each test (migrating one took about 0.15 s)."""
    from turnout.dashboard.store.db import Database

    path = tmp_path_factory.mktemp("sqlite-template") / "turnout.db"
    db = Database(f"sqlite:///{path}")
    db.upgrade()
    db.dispose()  # the last connection's close checkpoints the WAL into the file
    assert not path.with_name("turnout.db-wal").exists()
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store/API test runs on both backends, on a database migrated to the head and
    holding no rows: a copy of a migrated SQLite file, or this process's PostgreSQL schema
    emptied (``pg_schema_url`` gives a schema of its own, for a test that needs one)."""
    if request.param == "sqlite":
        path = tmp_path / "turnout.db"
        shutil.copyfile(request.getfixturevalue("_sqlite_template"), path)
        return f"sqlite:///{path}"
    if _PG_SKIP:
        pytest.skip(_PG_SKIP)
    return request.getfixturevalue("_reused_pg_schema").take()  # type: ignore[no-any-return]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[list[LiveService]]:
    """Services started by a test (``live.append(start_service(...))``), stopped afterwards."""
    started: list[LiveService] = []
    yield started
    for s in started:
        s.stop()


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    """The app in-process on a fresh database of each backend, with a token per role."""
    from fastapi.testclient import TestClient

    from turnout.dashboard.app import create_app
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings

    services = Services.build(Settings(database_url=db_url, demo=False, snapshot_ttl_s=0))
    app = create_app(services=services)
    with TestClient(app) as client:
        made = role_tokens(services.db)
        yield Api(client, services, made)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module's tests (browser_helpers.signed_in signs a page in)."""
    from playwright.sync_api import sync_playwright

    # The browser keeps the real clock: `make test-clock` preloads libfaketime into the test
    # process and the services it starts (what is tested), and chromium's timers stall under
    # it (every page load ran into Playwright's 30 s timeout).
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "FAKETIME")}
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=browser_helpers.CHROMIUM, args=["--no-sandbox"], env=env
        )
        yield b
        b.close()
