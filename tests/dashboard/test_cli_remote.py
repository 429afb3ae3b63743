"""The operator commands against a running ``turnout serve`` (a process on a loopback port, on
SQLite and on PostgreSQL): every command through the API as the token's holder, what a wrong
or weak token gets, two-person approval against one person with two shells, the contexts file,
and the direct database mode that no longer makes a database by accident."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
from cli_helpers import cli_app
from service_helpers import LiveService, free_port, make_tokens, start_service
from threaded_server import serve_in_thread
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
PASSING = b'<testsuite name="parity"><testcase classname="p" name="test_greedy"/></testsuite>'


@dataclass
class Shell:
    """An operator's shell: a service URL, a token, a config directory of its own."""

    url: str
    token: str | None
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {"XDG_CONFIG_HOME": str(self.home), "TURNOUT_URL": self.url, **extra}
        if self.token is not None:
            env["TURNOUT_TOKEN"] = self.token
        return env

    def run(self, *args: str, **extra: str) -> tuple[int, str]:
        """The command in this process (Typer's runner; stdout and stderr together)."""
        result = CliRunner(env=self.env(**extra)).invoke(cli_app(), list(args))
        return result.exit_code, result.output

    def process(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """The command as a process of its own, as a second shell runs it."""
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT / "src"),
            "HOME": str(self.home),
            **self.env(**extra),
        }
        return subprocess.run(
            [sys.executable, "-c", "from turnout.oracle.cli import main; main()", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


@dataclass
class Served:
    svc: LiveService
    tokens: dict[str, str]
    home: Path

    def shell(self, role: str | None = "operator", token: str | None = None) -> Shell:
        return Shell(self.svc.url, token or (self.tokens[role] if role else None), self.home)

    def get(self, path: str, role: str = "admin") -> object:
        r = httpx.get(
            self.svc.url + "/api/v1" + path,
            headers={"Authorization": f"Bearer {self.tokens[role]}"},
        )
        assert r.status_code == 200, r.text
        return r.json()

    def add_token(self, name: str, role: str = "operator") -> str:
        r = httpx.post(
            self.svc.url + "/api/v1/tokens",
            headers={"Authorization": f"Bearer {self.tokens['admin']}"},
            json={"name": name, "role": role},
        )
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def _serve(db_url: str, tmp: Path, **env: str) -> Served:
    made = make_tokens(db_url)
    svc = start_service(db_url, tmp / "svc.log", env={"TURNOUT_BACKGROUND": "false", **env})
    home = tmp / "config"
    home.mkdir(exist_ok=True)
    return Served(svc, made, home)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One service (SQLite) for the tests that change nothing, or nothing the others read."""
    tmp = tmp_path_factory.mktemp("shared")
    served = _serve(f"sqlite:///{tmp / 'shared.db'}", tmp)
    yield served
    served.svc.stop()


def test_every_operator_command_through_the_service(
    db_url: str, tmp_path: Path, live: list[LiveService]
) -> None:
    served = _serve(db_url, tmp_path)
    live.append(served.svc)
    op, admin = served.shell("operator"), served.shell("admin")

    def ok(shell: Shell, *args: str) -> str:
        code, out = shell.run(*args)
        assert code == 0, (args, out)
        return out

    assert "kill switch: released" in ok(served.shell("viewer"), "canary", "list")
    out = ok(op, "canary", "enable", "llama", "--percentage", "10", "--reason", "10% first")
    assert "llama-mistral-dense: enabled at 10% (version 2)" in out
    assert "already disabled" in ok(op, "canary", "disable", "pooling", "--reason", "off")
    out = ok(op, "canary", "ramp", "start", "qwen3", "--steps", "10,50", "--reason", "ramp")
    assert "ramp 1 of qwen3-canary (10% → 50%): active at 10% (step 1/2)" in out
    assert "ramp 1 of qwen3-canary" in ok(served.shell("viewer"), "canary", "ramp", "status")
    assert "cancelled: hold" in ok(op, "canary", "ramp", "cancel", "qwen3", "--reason", "hold")
    code, out = op.run("canary", "ramp", "resume", "qwen3", "--reason", "x")
    assert code == 2 and "qwen3-canary: no live ramp" in out
    out = ok(op, "canary", "schedule", "pooling", "--in", "2h", "--reason", "later")
    assert "flip 1: pooling enable at" in out and "(scheduled)" in out
    assert "nothing waits for approval" in ok(op, "approvals", "list")
    assert ok(op, "kill-switch", "engage", "--reason", "V2 crash loop") == "kill switch ENGAGED\n"
    assert ok(op, "kill-switch", "release", "--reason", "fixed") == "kill switch released\n"
    secret = ok(admin, "webhook", "add", "https://hooks.example.com/t", "-k", "flip")
    assert secret.startswith("whsec_")
    ok(op, "canary", "disable", "llama", "--reason", "off")  # one delivery
    assert "outbox: 1 pending, 0 delivered, 0 dead" in ok(admin, "webhook", "list")
    assert "pending" in ok(admin, "webhook", "outbox")
    assert "removed" in ok(admin, "webhook", "remove", "1", "--reason", "moved")
    code, out = admin.run("webhook", "retry", "1")  # dead, but its subscription was removed
    assert code == 1 and "subscription was removed" in out
    (tmp_path / "ok.xml").write_bytes(PASSING)
    out = ok(op, "evidence", "push", "--family", "qwen3", "--junit", str(tmp_path / "ok.xml"))
    assert out.startswith("qwen3: pass (") and "recorded as evidence 1" in out
    made = ok(admin, "token", "create", "--role", "viewer", "--name", "dash")
    token = made.splitlines()[0]
    assert token.startswith("tok_") and "(token 5, role viewer, never expires; shown once)" in made
    assert "dash" in ok(admin, "token", "list")
    assert ok(admin, "token", "revoke", "5", "--reason", "rotated") == "token 5 (dash) revoked\n"
    # Every change is audited as the token that made it.
    entries = served.get("/audit?limit=1000")
    assert isinstance(entries, list)
    actors = {(e["action"], e["actor"]) for e in entries}
    assert ("canary.flip", "operator (token 2)") in actors
    assert ("kill_switch.set", "operator (token 2)") in actors
    assert ("token.revoke", "admin (token 3)") in actors
    assert not [e for e in entries if e["actor"].startswith("cli:")]


def test_a_wrong_or_missing_token_is_refused_clearly(shared: Served, tmp_path: Path) -> None:
    code, out = shared.shell(token="tok_" + "x" * 43).run("canary", "list")
    assert code == 1
    assert out == (
        f"error: the service at {shared.svc.url} refused the token (TURNOUT_TOKEN): unknown or "
        "revoked token\n"
    )
    code, out = shared.shell(role=None).run("canary", "list")
    assert code == 1 and "TURNOUT_TOKEN is not set" in out
    down = Shell(f"http://127.0.0.1:{free_port()}", "tok_x", tmp_path)
    code, out = down.run("kill-switch", "engage", "--reason", "r")
    assert code == 1 and out.startswith(
        f"error: cannot reach the service at {down.url} (TURNOUT_URL)"
    )
    prefixed = Shell(shared.svc.url + "/api/v1/", shared.tokens["viewer"], tmp_path)
    assert prefixed.run("canary", "list")[0] == 0  # the API's prefix is the client's to add
    # Something else answers at the URL: the command says so, without a traceback.
    (tmp_path / "index.html").write_text("<html>not turnout</html>")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as other:
        serve_in_thread(other)
        elsewhere = Shell(f"http://127.0.0.1:{other.server_address[1]}", "tok_x", tmp_path)
        code, out = elsewhere.run("canary", "list")
        other.shutdown()
    assert code == 1 and "answered 404 File not found without turnout's error shape" in out, out
    assert f"is {elsewhere.url} (TURNOUT_URL) the turnout service?" in out
    # Neither TURNOUT_URL nor a context: the command says how to set one.
    result = CliRunner(env={"XDG_CONFIG_HOME": str(tmp_path), "TURNOUT_URL": None}).invoke(
        cli_app(), ["canary", "list"]
    )
    assert result.exit_code == 1 and result.output.startswith("error: no service to call")
    assert "TURNOUT_URL and TURNOUT_TOKEN" in result.output


def test_a_viewer_token_reads_and_is_refused_a_write(shared: Served) -> None:
    viewer = shared.shell("viewer")
    before = shared.get("/canaries")
    assert viewer.run("canary", "list")[0] == 0
    assert viewer.run("approvals", "list")[0] == 0
    for args in (
        ("canary", "enable", "pooling", "--reason", "r"),
        ("kill-switch", "engage", "--reason", "r"),
        ("canary", "schedule", "pooling", "--in", "1h", "--reason", "r"),
    ):
        code, out = viewer.run(*args)
        assert code == 1, (args, out)
        assert (
            out
            == "error: this needs the operator role; the token has viewer (token: TURNOUT_TOKEN)\n"
        )
    code, out = shared.shell("operator").run("token", "list")
    assert code == 1 and "this needs the admin role; the token has operator" in out
    assert shared.get("/canaries") == before


def test_one_token_in_two_shells_cannot_approve_its_own_request(
    tmp_path: Path, live: list[LiveService]
) -> None:
    served = _serve(f"sqlite:///{tmp_path / 'two.db'}", tmp_path, TURNOUT_REQUIRE_APPROVAL="true")
    live.append(served.svc)
    alice = served.add_token("alice")
    first = served.shell(token=alice).process(
        "canary", "enable", "pooling", "--percentage", "50", "--reason", "go", USER="alice"
    )
    assert first.returncode == 0, first.stderr
    assert "waiting for another operator's approval (flip 1" in first.stdout
    # A second shell with the same token, whatever it calls itself.
    for user in ("bob", "alice"):
        second = served.shell(token=alice).process(
            "approvals", "approve", "flip", "1", "--reason", "lgtm", USER=user, LOGNAME=user
        )
        assert second.returncode == 2, second.stderr
        assert "flip 1 was requested by alice (token 5): another operator must approve it" in (
            second.stderr
        )
    # A second token of the same holder (a rotation keeps the name) is the same person.
    again = served.add_token("alice")
    third = served.shell(token=again).process("approvals", "approve", "flip", "1", "--reason", "x")
    assert third.returncode == 2 and "another operator must approve it" in third.stderr
    assert served.get("/approvals") != []
    bob = served.shell(token=served.add_token("bob")).process(
        "approvals", "approve", "flip", "1", "--reason", "checked", USER="alice"
    )
    assert bob.returncode == 0 and bob.stdout == "flip 1: approved\n", bob.stderr
    [flip] = served.get("/scheduled-flips")  # type: ignore[misc]
    assert (flip["requested_by"], flip["approved_by"]) == ("alice (token 5)", "bob (token 7)")


def test_a_typo_in_the_database_url_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "turnout.db"
    url = f"sqlite:///{missing}"
    env = {"XDG_CONFIG_HOME": str(tmp_path), "TURNOUT_URL": None, "TURNOUT_DATABASE_URL": url}
    runner = CliRunner(env=env)
    # Commands with a --create flag name it; the others name the command that has one (they
    # suggested a --create they did not take).
    for args, how in (
        (["db", "upgrade"], "--create"),
        (["db", "current"], "db upgrade --create"),
        (["db", "retention"], "db upgrade --create"),
        (["token", "create", "--role", "admin"], "--create"),
        (["demo", "remove"], "db upgrade --create"),
    ):
        result = runner.invoke(cli_app(), args)
        assert result.exit_code == 1, (args, result.output)
        assert result.output.startswith(
            f"error: the database {url} does not exist, and nothing was created: check the URL "
            "(TURNOUT_DATABASE_URL, --database-url), or make a new database with "
        ), result.output
        assert result.output.rstrip().endswith(how), (args, result.output)
        assert ("turnout db upgrade" in result.output) is (how != "--create"), result.output
    for args in (["canary", "list"], ["approvals", "approve", "flip", "1", "--reason", "r"]):
        result = runner.invoke(cli_app(), [*args, "--database-url", url])
        assert result.exit_code == 2 and "goes through the service now" in result.output
    assert not missing.parent.exists()
    result = runner.invoke(cli_app(), ["token", "create", "--role", "admin", "--create"])
    assert result.exit_code == 0 and result.output.startswith("tok_"), result.output
    assert missing.exists()


def test_postgresql_a_missing_database_is_named_and_made_only_when_told(
    pg_schema_url: str,
) -> None:
    import psycopg

    base = pg_schema_url.split("?")[0].rsplit("/", 1)[0]
    name = f"turnout_t_{uuid.uuid4().hex[:12]}"
    url = f"{base}/{name}"
    runner = CliRunner(env={"TURNOUT_URL": None, "TURNOUT_DATABASE_URL": url})
    libpq = base.replace("postgresql+psycopg://", "postgresql://") + "/test"

    def exists() -> bool:
        with psycopg.connect(libpq, autocommit=True) as conn:
            return (
                conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
                is not None
            )

    result = runner.invoke(cli_app(), ["db", "upgrade"])
    assert result.exit_code == 1 and f"the database {url} does not exist" in result.output
    assert not exists()
    try:
        result = runner.invoke(cli_app(), ["db", "upgrade", "--create"])
        assert result.exit_code == 0 and f"database {url} at revision" in result.output, (
            result.output
        )
        assert exists()
        result = runner.invoke(cli_app(), ["token", "create", "--role", "admin"])
        assert result.exit_code == 0 and result.output.startswith("tok_"), result.output
    finally:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_contexts_of_the_config_file(shared: Served, tmp_path: Path) -> None:
    home = tmp_path / "xdg"
    path = home / "turnout" / "config.yaml"
    base = {"XDG_CONFIG_HOME": str(home), "TURNOUT_URL": None, "TURNOUT_TOKEN": None}

    def run(*args: str, stdin: str | None = None, **env: str | None) -> tuple[int, str]:
        result = CliRunner(env={**base, **env}).invoke(cli_app(), list(args), input=stdin)
        return result.exit_code, result.output

    code, out = run("context", "set", "local", "--url", shared.svc.url, "--token-env", "OPS_TOKEN")
    assert code == 0 and out.strip() == (
        f"context local: {shared.svc.url}, token: $OPS_TOKEN (the current context)"
    )
    assert os.stat(path).st_mode & 0o777 == 0o600
    code, out = run("canary", "list", OPS_TOKEN=shared.tokens["viewer"])
    assert code == 0 and "kill switch: released" in out, out
    code, out = run("canary", "list")
    assert code == 1 and f"$OPS_TOKEN (context 'local' of {path}) is not set" in out
    # The token kept in the file (read from stdin), and a second context to switch to.
    code, out = run(
        "context",
        "set",
        "ops",
        "--url",
        shared.svc.url + "/",
        "--token-stdin",
        stdin=shared.tokens["operator"] + "\n",
    )
    assert code == 0 and "(use it: turnout context use ops)" in out
    assert shared.tokens["operator"] in path.read_text()
    assert run("context", "use", "ops") == (0, f"current context: ops ({shared.svc.url})\n")
    code, out = run("context", "list")
    assert out.splitlines() == [
        f"  local  {shared.svc.url}  token: $OPS_TOKEN",
        f"* ops  {shared.svc.url}  token: token in the file",
    ]
    code, out = run("kill-switch", "release", "--reason", "through ops")
    assert code == 0 and "kill switch already released" in out
    # TURNOUT_URL wins over the current context, --context over both.
    down = f"http://127.0.0.1:{free_port()}"
    code, out = run("canary", "list", TURNOUT_URL=down, TURNOUT_TOKEN="tok_x")
    assert code == 1 and f"cannot reach the service at {down} (TURNOUT_URL)" in out
    code, out = run("canary", "list", "--context", "ops", TURNOUT_URL=down)
    assert code == 0, out
    code, out = run("canary", "list", "--context", "nope")
    assert code == 1 and out == "error: no context 'nope' (local, ops)\n"
    code, out = run("context", "use", "nope")
    assert code == 2 and "no context 'nope'" in out
    # A file that keeps a token and that others may read is refused, as ssh refuses a key.
    path.chmod(0o644)
    code, out = run("canary", "list")
    assert code == 1 and out.strip() == (
        f"error: {path} keeps a token and others may read it (mode 0644): chmod 600 {path}, or "
        "keep the token in a variable (token_env)"
    )
    path.chmod(0o600)
    # What does not read names file:line.
    path.write_text("contexts:\n  local:\n    url: [http://x\n")
    code, out = run("canary", "list")
    assert code == 1 and out.startswith(f"error: {path}:4: YAML syntax"), out
    path.write_text("current-context: local\ncontexts:\n  local:\n    token_env: T\n")
    code, out = run("canary", "list")
    assert code == 1 and out.strip() == f"error: {path}:4: context 'local' has no url"
    path.write_text("contexts:\n  local:\n    url: ftp://x\n")
    code, out = run("context", "list")
    assert code == 1 and out.startswith(f"error: {path}:3: context 'local': 'ftp://x' is not")
    path.write_text("contexts: {}\ncurrent_context: x\n")
    code, out = run("context", "list")
    assert code == 1 and "config.yaml:2: unknown key 'current_context'" in out


def test_engines_and_audit_read_through_the_service(shared: Served) -> None:
    from turnout.oracle import decide, from_spec, load_pack
    from turnout.oracle.wire import engine_registration

    config = from_spec({"architecture": "Qwen3ForCausalLM", "deployment_id": "prod/cli-1"})
    body = engine_registration(
        decide(config, pack=load_pack("turnout")),
        config,
        engine_id="cli-engine-1",
        address="10.1.2.3:8001",
        engine="turnout",
        vllm_version="0.33.0",
        pack="turnout",
        deployment_id="prod/cli-1",
    ).model_dump(mode="json")
    engine = {"Authorization": f"Bearer {shared.tokens['engine']}"}
    r = httpx.put(f"{shared.svc.url}/api/v1/engines/cli-engine-1", json=body, headers=engine)
    assert r.status_code == 201, r.text
    viewer = shared.shell("viewer")
    code, out = viewer.run("engines")
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("10.1.2.3:8001"))
    assert "prod/cli-1  qwen3  stage qwen3-canary (canary)  runs v2" in line and "STALE" not in line
    assert out.splitlines()[-1].startswith("1 engine(s), 0 on an old decision")
    code, out = viewer.run("engines", "--stale", "--json")
    assert code == 0 and json.loads(out)["engines"] == []
    # A flip leaves it on an old decision: --stale lists it, and says what a restart gives.
    code, out = shared.shell("operator").run(
        "canary", "disable", "qwen3-canary", "--reason", "cli engines test"
    )
    assert code == 0, out
    try:
        code, out = viewer.run("engines", "--stale")
        assert code == 0 and "runs v2 (a restart gives v1: STALE)" in out, out
        code, out = viewer.run("audit", "--target", "qwen3-canary", "--limit", "1")
        assert code == 0, out
        assert out.split("  ")[2:] == [
            "operator (token 2)",
            "canary.flip cohort:qwen3-canary: cli engines test\n",
        ], out
    finally:
        shared.shell("operator").run(
            "canary", "enable", "qwen3-canary", "--reason", "cli engines test done"
        )
        httpx.delete(f"{shared.svc.url}/api/v1/engines/cli-engine-1", headers=engine)
    code, out = shared.shell("engine").run("canary", "enable", "qwen3-canary", "--reason", "x")
    assert code == 1 and "this needs the operator role; the token has engine" in out, out


def test_engines_and_audit_refuse_what_names_nothing(shared: Served) -> None:
    viewer = shared.shell("viewer")
    code, out = viewer.run("engines", "--stage", "nope")
    assert code == 2 and "'nope' is no stage or family; the stages: " in out, out
    code, out = viewer.run("engines", "--stage", "qwen3", "--json")  # a family: its stage
    assert code == 0 and json.loads(out.split("\n", 1)[1])["num_engines"] >= 0, out
    r = httpx.get(
        f"{shared.svc.url}/api/v1/engines?stage=nope",
        headers={"Authorization": f"Bearer {shared.tokens['viewer']}"},
    )
    assert r.status_code == 422 and "unknown stage 'nope'" in r.text
    for target in ("nope", "token:abc", ":", "cohort:", "flip:1"):
        code, out = viewer.run("audit", "--target", target)
        assert code == 2 and "error: " in out, (target, out)
    code, out = viewer.run("audit", "--target", "")
    assert code != 0, out


def test_engines_and_audit_say_so_when_the_answer_is_not_the_services(tmp_path: Path) -> None:
    """A server that answers JSON of another shape: a clear error, never a traceback."""
    bodies = iter([b"[]", b"{}", b'{"engines": [{"address": 1}], "num_engines": 1}'])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = next(bodies, b"null")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    try:
        shell = Shell(f"http://127.0.0.1:{server.server_address[1]}", "tok_x", tmp_path)
        commands = (["engines"], ["engines"], ["engines"], ["audit"], ["engines", "--stage", "x"])
        for command in commands:
            result = CliRunner(env=shell.env()).invoke(cli_app(), command)
            assert result.exit_code == 1, (command, result.output)
            assert "answered JSON of another shape: is it the turnout service?" in result.output
            assert not isinstance(result.exception, (KeyError, TypeError, ValueError))
    finally:
        server.shutdown()


def test_a_bad_setting_is_named_as_the_user_wrote_it(tmp_path: Path) -> None:
    # pydantic named the field ("freeze_heap"), which the user never wrote.
    url = f"sqlite:///{tmp_path / 'x.db'}"
    env = {"XDG_CONFIG_HOME": str(tmp_path), "TURNOUT_URL": None, "TURNOUT_DATABASE_URL": url}
    result = CliRunner(env={**env, "TURNOUT_FREEZE_HEAP": "maybe"}).invoke(
        cli_app(), ["db", "current"]
    )
    assert result.exit_code == 1
    assert result.output.startswith(
        "error: TURNOUT_FREEZE_HEAP='maybe': Input should be a valid boolean"
    ), result.output
    result = CliRunner(env=env).invoke(cli_app(), ["serve", "--port", "99999", "--no-demo"])
    assert result.exit_code == 1
    assert result.output.startswith("error: --port=99999: Input should be less than"), result.output
