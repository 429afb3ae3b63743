"""The operator commands against a service: the app served over HTTP on a loopback port by a
uvicorn server in a thread of the test process (a fresh database per test in a fraction of a
second, where a ``turnout serve`` process takes seconds to start), and the commands run
through Typer's runner with ``TURNOUT_URL`` and ``TURNOUT_TOKEN`` set."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from service_helpers import free_port, role_tokens
from typer.testing import CliRunner

from turnout.dashboard import cli

if TYPE_CHECKING:
    from turnout.dashboard.services import Services


def cli_app() -> typer.Typer:
    """The ``turnout`` application with the service's commands."""
    app = typer.Typer()
    cli.register(app)
    return app


@dataclass
class ServiceCli:
    """A served database with a token per role (named after it: viewer, operator, admin) and
    the command line that calls it as one of them (``role``, or a ``token`` given)."""

    url: str
    db_url: str
    services: Services
    tokens: dict[str, str]
    config_home: Path
    role: str = "admin"

    def env(self, token: str | None = None, **extra: str) -> dict[str, str]:
        return {
            "TURNOUT_URL": self.url,
            "TURNOUT_TOKEN": token or self.tokens[self.role],
            "XDG_CONFIG_HOME": str(self.config_home),
            **extra,
        }

    def __call__(
        self, *args: str, token: str | None = None, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        result = CliRunner(env=self.env(token, **(env or {}))).invoke(cli_app(), list(args))
        return result.exit_code, result.output

    def add_token(self, name: str, role: str = "operator") -> str:
        """Another token, made on the database."""
        from turnout.dashboard.store import tokens

        with self.services.db.write_session() as s:
            _row, token = tokens.create_token(
                session=s, name=name, role=tokens.Role(role), actor="tests"
            )
            s.commit()
        return token


@contextmanager
def served(tmp_path: Path, db_url: str | None = None, **settings: Any) -> Iterator[ServiceCli]:
    """The app on a fresh database (SQLite in ``tmp_path`` unless ``db_url``), without its
    background ticker unless ``settings`` say otherwise, until the block ends."""
    import uvicorn

    from turnout.dashboard.app import create_app, prepare
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings

    db_url = db_url or f"sqlite:///{tmp_path / 'service.db'}"
    options = {"demo": False, "background": False, "snapshot_ttl_s": 0, **settings}
    services = Services.build(Settings(database_url=db_url, **options))
    prepare(services)
    made = role_tokens(services.db)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(services=services), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.01)
    home = tmp_path / "config"
    home.mkdir(exist_ok=True)
    try:
        yield ServiceCli(f"http://127.0.0.1:{port}", db_url, services, made, home)
    finally:
        server.should_exit = True
        thread.join(10)
        services.db.dispose()
