"""The ``turnout`` commands README.md and docs/service.md show run as shown, in order, against a
service on a fresh database (the service's commands, with ``TURNOUT_URL`` and an admin's
``TURNOUT_TOKEN`` as the docs export them) and from the repository root (the oracle's)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from service_helpers import Api, LiveService, start_service
from typer.testing import CliRunner

from turnout.dashboard import cli
from turnout.oracle.cli import app as oracle_app

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ("token", "canary", "kill-switch", "demo", "db", "context")
DOC_URL = "http://127.0.0.1:8000"


def _commands(doc: str) -> list[list[str]]:
    """Every ``.venv/bin/turnout ...`` line of the doc's ``bash`` blocks, split as a shell
    would (comments dropped); lines with a command substitution are left out."""
    text = (ROOT / doc).read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith(".venv/bin/turnout ") and "$(" not in line:
                out.append(shlex.split(line, comments=True)[1:])
    return out


@pytest.mark.parametrize("doc", ["README.md", "docs/service.md"])
def test_the_service_commands_run_as_shown(
    doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live: list[LiveService]
) -> None:
    app = typer.Typer()
    cli.register(app)
    commands = [c for c in _commands(doc) if c[0] in SERVICE]
    assert commands
    db_url = f"sqlite:///{tmp_path / 'doc.db'}"
    env = {"TURNOUT_DATABASE_URL": db_url, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    # The bootstrap admin token, made on the database before the service's first start.
    made = CliRunner(env=env).invoke(
        app, ["token", "create", "--role", "admin", "--name", "docs", "--create"]
    )
    assert made.exit_code == 0, made.output
    svc = start_service(db_url, tmp_path / "svc.log", env={"TURNOUT_BACKGROUND": "false"})
    live.append(svc)
    token = made.output.splitlines()[0]
    runner = CliRunner(env={**env, "TURNOUT_URL": svc.url, "TURNOUT_TOKEN": token})
    monkeypatch.chdir(ROOT)
    for doc_args in commands:
        args = [a.replace(DOC_URL, svc.url) for a in doc_args]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert "already" not in result.output, (args, result.output)  # each flip changes


def test_the_oracle_commands_of_the_readme_run_as_shown(
    monkeypatch: pytest.MonkeyPatch, api: Api, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    # `launch` becomes vLLM: tests/oracle/test_launch.py runs it against a stand-in vllm;
    # `engine serve` is a server: tests/serving starts it as the README does
    commands = [
        c
        for c in _commands("README.md")
        if c[0] not in SERVICE and c[0] not in ("generate", "embed", "launch", "engine")
    ]
    assert [c[0] for c in commands] == ["decide"] * 3 + ["matrix", "decide", "decide"]
    # var/canaries.json: what the README's curl line saves
    snapshot = tmp_path / "canaries.json"
    snapshot.write_text(api.client.get("/api/v1/canaries", headers=api.h("viewer")).text)
    commands = [[str(snapshot) if a == "var/canaries.json" else a for a in c] for c in commands]
    assert sum(str(snapshot) in c for c in commands) == 1
    codes = [CliRunner().invoke(oracle_app, args).exit_code for args in commands]
    # Both files hold bad input on purpose (README says so): exit 2; the matrix diff of two
    # releases and the upgrade comparison of the recipes find changes: exit 1 (README says so).
    assert codes == [0, 2, 2, 1, 1, 0]
