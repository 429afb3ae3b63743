"""The operator CLI's contexts file and remote target, without a service: what is refused
before anything is sent, and what two shells editing the file at once keep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli_app
from typer.testing import CliRunner

from turnout.dashboard import contexts
from turnout.dashboard.remote import Remote, RemoteError

ROOT = Path(__file__).resolve().parents[2]


def _run(home: Path, *args: str) -> tuple[int, str]:
    env = {"XDG_CONFIG_HOME": str(home), "TURNOUT_URL": None, "TURNOUT_TOKEN": None}
    result = CliRunner(env=env).invoke(cli_app(), list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "url",
    ["https://ops:s3cret@turnout.internal", "http://s3cret@127.0.0.1:8000", "ftp://u:s3cret@x"],
)
def test_a_url_with_a_user_or_password_is_refused_and_never_echoed(
    tmp_path: Path, url: str
) -> None:
    code, out = _run(tmp_path, "context", "set", "prod", "--url", url)
    assert code == 2 and "user or password before '@' is refused" in out
    assert "s3cret" not in out
    code, out = _run(tmp_path, "canary", "list", "--url", url, "--token", "tok_x")
    assert code != 0 and "s3cret" not in out


def test_an_unreadable_host_is_named(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "context", "set", "prod", "--url", "http://[::1")
    assert (
        code == 2
        and out == "error: 'http://[::1' is not a service URL: its host or port cannot be read\n"
    )


def test_a_current_context_that_is_not_a_name_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "turnout" / "config.yaml"
    path.parent.mkdir()
    path.write_text("contexts:\n  a:\n    url: http://x\ncurrent-context: [a, b]\n")
    code, out = _run(tmp_path, "context", "list")
    assert code == 1 and out == f"error: {path}:4: current-context is not a context name\n"


@pytest.mark.parametrize("token", ["s3cret\n", "s3 cret", "s3cret\x00", "s3crét"])
def test_a_token_with_whitespace_or_control_characters_is_refused_unseen(token: str) -> None:
    target = contexts.Target("http://127.0.0.1:9", token, "TURNOUT_URL", "TURNOUT_TOKEN")
    with pytest.raises(RemoteError) as caught:
        Remote(target)
    assert "TURNOUT_TOKEN holds a space, a line break or another character" in str(caught.value)
    assert "s3" not in str(caught.value)


def test_two_shells_setting_contexts_at_once_keep_both(tmp_path: Path) -> None:
    """Eight processes each add a context to the same file at the same moment: the file's
    lock serialises read-change-write, so none is lost (without it, last writer wins)."""
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin"}
    code = "from turnout.oracle.cli import main; main()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "context", "set", f"c{i}", "--url", f"http://h{i}:80"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(8)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    config = contexts.load(contexts.config_path({"XDG_CONFIG_HOME": str(tmp_path)}))
    assert sorted(config.contexts) == [f"c{i}" for i in range(8)]
    assert config.current in config.contexts


@pytest.mark.parametrize(
    "url", ["http://u:s3cret@[::1", "http://u:s3cret@h\u2100x", "http://s3cret@h:abc"]
)
def test_a_url_with_user_info_is_refused_unseen_even_when_it_does_not_parse(
    tmp_path: Path, url: str
) -> None:
    code, out = _run(tmp_path, "context", "set", "prod", "--url", url)
    assert code == 2 and "user or password before '@' is refused" in out and "s3cret" not in out


@pytest.mark.parametrize("url", ["http://h:abc", "http://h:99999"])
def test_a_port_that_is_no_port_is_refused(tmp_path: Path, url: str) -> None:
    code, out = _run(tmp_path, "context", "set", "prod", "--url", url)
    assert code == 2 and "its host or port cannot be read" in out
    code, out = _run(tmp_path, "engines", "--url", url)  # engines takes no --url: a usage error
    assert code == 2
    env = {"XDG_CONFIG_HOME": str(tmp_path), "TURNOUT_URL": url, "TURNOUT_TOKEN": "tok_x"}
    result = CliRunner(env=env).invoke(cli_app(), ["engines"])
    assert result.exit_code == 1 and "its host or port cannot be read" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_token_stdin_refuses_a_token_it_would_later_refuse(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "TURNOUT_URL": None, "TURNOUT_TOKEN": None}
    result = CliRunner(env=env).invoke(
        cli_app(),
        ["context", "set", "a", "--url", "http://h:80", "--token-stdin"],
        input="tok_ab cd s3cret\n",
    )
    assert result.exit_code == 2 and "s3cret" not in result.output
    assert not (tmp_path / "turnout" / "config.yaml").exists()
