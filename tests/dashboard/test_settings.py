"""The default database does not depend on the working directory: ``turnout canary …`` run from
anywhere uses the database ``make run`` serves; ``TURNOUT_DATABASE_URL`` overrides it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnout.dashboard import settings
from turnout.dashboard.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_is_the_checkouts_var_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNOUT_DATABASE_URL", raising=False)
    urls = []
    for sub in ("a", "b/c"):
        (tmp_path / sub).mkdir(parents=True)
        monkeypatch.chdir(tmp_path / sub)
        urls.append(Settings().database_url)
    assert urls == [f"sqlite:///{ROOT / 'var' / 'turnout.db'}"] * 2
    path = Settings().sqlite_path()
    assert path is not None and path.is_absolute()


def test_an_installed_copy_defaults_to_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNOUT_DATABASE_URL", raising=False)
    monkeypatch.setattr(settings, "CHECKOUT_ROOT", None)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert Settings().database_url == f"sqlite:///{tmp_path / 'data' / 'turnout' / 'turnout.db'}"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings().sqlite_path() == tmp_path / "home" / ".local/share/turnout/turnout.db"


@pytest.mark.parametrize("xdg", ["data", "./data", "~/data"])
def test_a_relative_xdg_data_home_is_ignored_as_the_spec_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xdg: str
) -> None:
    # Resolved against the working directory it named another database in every directory.
    monkeypatch.delenv("TURNOUT_DATABASE_URL", raising=False)
    monkeypatch.setattr(settings, "CHECKOUT_ROOT", None)
    monkeypatch.setenv("XDG_DATA_HOME", xdg)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    paths = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        monkeypatch.chdir(tmp_path / sub)
        paths.append(Settings().sqlite_path())
    assert paths == [tmp_path / "home" / ".local/share/turnout/turnout.db"] * 2


def test_the_environment_overrides_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNOUT_DATABASE_URL", "postgresql+psycopg://u@db/turnout")
    assert Settings().database_url == "postgresql+psycopg://u@db/turnout"


def _turnout(
    checkout: Path, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real ``turnout`` command line run in ``cwd``, as if the source checkout were at
    ``checkout`` (so that the test writes no database into this one)."""
    code = (
        "import sys; from pathlib import Path; import turnout.dashboard.settings as s; "
        f"s.CHECKOUT_ROOT = Path({str(checkout)!r}); "
        "from turnout.oracle.cli import main; main(sys.argv[1:])"
    )
    full_env = {k: v for k, v in os.environ.items() if k != "TURNOUT_DATABASE_URL"}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), full_env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**full_env, **(env or {})},
        timeout=120,
    )


def test_the_commands_use_one_database_from_any_directory(tmp_path: Path) -> None:
    """The bootstrap commands (the only ones that open the database directly: the operator
    commands go through the service) find the checkout's database from any directory, and
    never make another one by accident."""
    checkout, here, there = tmp_path / "checkout", tmp_path / "here", tmp_path / "there" / "x"
    for d in (checkout, here, there):
        d.mkdir(parents=True)
    db = checkout / "var" / "turnout.db"
    r = _turnout(checkout, here, "db", "upgrade", "--create")
    assert r.returncode == 0, r.stderr
    from alembic.script import ScriptDirectory

    from turnout.dashboard.store.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert r.stdout.strip() == f"database sqlite:///{db} at revision {head}"
    r = _turnout(checkout, there, "token", "create", "--role", "admin", "--name", "alice")
    assert r.returncode == 0, r.stderr
    r = _turnout(checkout, there, "db", "current")  # the revision of the checkout's database
    assert r.returncode == 0 and r.stdout.strip() == head, (r.stdout, r.stderr)
    assert db.is_file()
    assert not (here / "var").exists() and not (there / "var").exists()
    # TURNOUT_DATABASE_URL names another database, which is not made without --create.
    other = tmp_path / "other.db"
    r = _turnout(
        checkout, here, "db", "current", env={"TURNOUT_DATABASE_URL": f"sqlite:///{other}"}
    )
    assert r.returncode == 1 and str(other) in r.stderr and "--create" in r.stderr, r.stderr
    assert not other.exists()


@pytest.mark.parametrize(
    "value, says",
    [
        ("nope", "TURNOUT_RAMP_GATES is not JSON (Expecting value: line 1 column 1 (char 0))"),
        ('{"min_engines": 0}', "ramp_gates.min_engines"),
    ],
)
def test_ramp_gates_that_cannot_be_read_end_the_command_saying_why(
    tmp_path: Path, value: str, says: str
) -> None:
    """A JSON setting that is not JSON was a pydantic_settings traceback (SettingsError is no
    ValidationError), for ``turnout serve`` and every command."""
    r = _turnout(
        tmp_path,
        tmp_path,
        "db",
        "current",
        env={"TURNOUT_RAMP_GATES": value, "TURNOUT_DATABASE_URL": f"sqlite:///{tmp_path / 't.db'}"},
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and says in r.stderr, r.stderr


@pytest.mark.parametrize("freeze", [True, False])
def test_the_served_app_freezes_its_heap_once_started_unless_told_not_to(
    tmp_path: Path, freeze: bool
) -> None:
    import gc

    from fastapi.testclient import TestClient

    from turnout.dashboard.app import create_app
    from turnout.dashboard.services import Services

    services = Services.build(
        Settings(database_url=f"sqlite:///{tmp_path / 't.db'}", demo=False, freeze_heap=freeze)
    )
    assert gc.get_freeze_count() == 0
    try:
        with TestClient(create_app(services=services, freeze_heap=True)) as client:
            assert client.get("/healthz").status_code == 200
            frozen = gc.get_freeze_count()
        # An app that is not the server's own process never freezes (a test run builds many).
        with TestClient(create_app(services=services)) as client:
            assert client.get("/healthz").status_code == 200
            assert gc.get_freeze_count() <= frozen  # frozen objects still die by refcount
    finally:
        gc.unfreeze()
    assert (frozen > 10_000) is freeze, frozen
