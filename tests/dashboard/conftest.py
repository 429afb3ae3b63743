"""Fixtures of the service tests: a fresh database per test on SQLite and on the local
PostgreSQL (one schema per test, dropped afterwards), a built app with tokens of every role."""

from __future__ import annotations

import os
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


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store/API test runs on both backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'turnout.db'}"
    return str(request.getfixturevalue("pg_schema_url"))


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
