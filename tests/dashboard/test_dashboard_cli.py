"""The service's ``turnout`` commands (registered through the ``turnout.cli`` entry point): the
operator commands against a served database (``cli_helpers.served``), the bootstrap and
upkeep ones (``db``, ``demo``, an admin token) on the database directly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from cli_helpers import ServiceCli, served
from sqlalchemy import select
from typer.testing import CliRunner

from turnout.dashboard import cli
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.dashboard.store import audit, canaries, events, tokens
from turnout.dashboard.store.models import AuditEntry
from turnout.oracle import load_pack


@pytest.fixture
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A command on the database ``cli.db`` directly (``--database-url``)."""
    app = typer.Typer()
    cli.register(app)
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    def invoke(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--database-url", url])
        return result.exit_code, result.output

    invoke.url = url  # type: ignore[attr-defined]
    return invoke


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[ServiceCli]:
    """A command through a served database, as its admin token (``token=`` for another)."""
    with served(tmp_path) as service_cli:
        yield service_cli


def _services(url: str) -> Services:
    return Services.build(Settings(database_url=url, demo=False))


def test_entry_point_registers_the_service_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in ("serve", "db", "token", "canary", "kill-switch", "demo", "context"):
        assert f" {name} " in out


def test_db_upgrade_and_token_create(run) -> None:  # type: ignore[no-untyped-def]
    from alembic.script import ScriptDirectory

    from turnout.dashboard.store.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    code, out = run("db", "upgrade")  # a database that does not exist is not made
    assert code == 1 and f"the database {run.url} does not exist, and nothing was created" in out
    assert not Path(run.url.removeprefix("sqlite:///")).exists()
    code, out = run("db", "upgrade", "--create")
    assert code == 0 and f"revision {head}" in out
    code, out = run("token", "create", "--role", "admin", "--name", "alice")
    assert code == 0
    token = out.splitlines()[0].strip()
    with _services(run.url).db.read_session() as s:
        row = tokens.verify_token(session=s, token=token)
        assert row is not None and (row.role, row.name) == ("admin", "alice")
        assert row.created_by.endswith(" (database)")
    # On the database directly only the bootstrap admin token is made.
    code, out = run("token", "create", "--role", "operator", "--name", "bob")
    assert code == 2 and "an operator token is made through the service, with an admin token" in out
    code, out = run("token", "create", "--role", "root")
    assert code == 2 and "viewer, engine, operator or admin" in out


def test_token_commands_refuse_bad_input_without_a_traceback(
    run,  # type: ignore[no-untyped-def]
    remote: ServiceCli,
) -> None:
    assert run("db", "upgrade", "--create")[0] == 0
    code, out = run("token", "create", "--role", "admin", "--name", "  ")
    assert code == 2 and "a token needs a name" in out
    code, out = remote("token", "create", "--role", "viewer", "--name", "  ")
    assert code == 2 and "a token needs a name" in out
    code, out = remote("token", "revoke", "99999999999999999999999", "--reason", "x")
    assert code == 2 and "Invalid value for 'token_id'" in out
    code, out = remote("token", "revoke", "12345", "--reason", "x")
    assert code == 2 and "no token with id 12345" in out


def test_canary_flips_by_family_name_and_are_audited(remote: ServiceCli) -> None:
    first = load_pack("turnout").cohorts[0]
    family = first.families[0]
    # The audit names the token's holder, whatever the shell's user says it is.
    as_operator = {"token": remote.tokens["operator"], "env": {"USER": "mallory"}}
    code, out = remote("canary", "disable", family, "--reason", "p99 regression", **as_operator)  # type: ignore[arg-type]
    assert code == 0, out
    assert first.id in out and "disabled" in out
    code, out = remote(
        "canary",
        "enable",
        first.id,
        "--percentage",
        "10",
        "--reason",
        "10% first",
        **as_operator,  # type: ignore[arg-type]
    )
    assert code == 0, out
    with remote.services.db.read_session() as s:
        state = canaries.read_state(session=s)
        entries = audit.list_entries(session=s)
    assert state.cohorts[first.id][:2] == (True, 10)
    assert [(e.reason, e.actor) for e in entries[:2]] == [
        ("10% first", "operator (token 2)"),
        ("p99 regression", "operator (token 2)"),
    ]
    code, out = remote("canary", "enable", "no-such-stage", "--reason", "x")
    ids = ", ".join(c.id for c in load_pack("turnout").cohorts)
    assert code == 2 and out.strip() == f"error: unknown cohort 'no-such-stage'; cohorts: {ids}"
    code, out = remote("canary", "enable", first.id)
    assert code == 2 and "--reason" in out
    code, out = remote("canary", "list", token=remote.tokens["viewer"])
    assert code == 0 and first.id in out and "kill switch: released" in out


def test_canary_flip_to_the_current_state_changes_nothing(remote: ServiceCli) -> None:
    first = load_pack("turnout").cohorts[0]  # on at 100% by default
    code, out = remote("canary", "enable", first.id, "--reason", "again")
    assert code == 0, out
    assert out.strip() == f"{first.id}: already enabled at 100%; nothing changed (version 1)"
    code, out = remote("canary", "disable", first.id, "--reason", "off")
    assert code == 0 and out.strip() == f"{first.id}: disabled (version 2)"
    code, out = remote("canary", "disable", first.id, "--reason", "off again")
    assert out.strip() == f"{first.id}: already disabled; nothing changed (version 2)"
    with remote.services.db.read_session() as s:
        flips = [e.reason for e in audit.list_entries(session=s) if e.action.startswith("canary")]
        assert flips == ["off"]
        assert canaries.read_state(session=s).cohorts[first.id] == (False, 100, 2)


def test_canary_list_is_a_table_that_fits_80_columns(remote: ServiceCli) -> None:
    narrow = {"COLUMNS": "80"}
    pack = load_pack("turnout")
    stage = pack.cohorts[1]
    code, out = remote(
        "canary", "enable", stage.id, "--percentage", "10", "--reason", "10% first", env=narrow
    )
    assert code == 0, out
    code, out = remote("canary", "list", env=narrow)
    assert code == 0, out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].split() == ["cohort", "families", "enabled", "%", "version", "last", "change"]
    starts = [line.split()[0] for line in lines[1:-1] if line[:1] != " "]
    assert starts == [c.id for c in pack.cohorts]  # rollout order, ids whole
    row = next(line for line in lines if line.startswith(stage.id + " ")).split()
    assert row[1:3] == [f"{stage.families[0]},", stage.families[1]]
    assert row[3:6] == ["yes", "10", "2"]
    assert "admin (token 3)" in out
    first = next(line for line in lines if line.startswith(pack.cohorts[0].id + " ")).split()
    assert first[1:5] == [pack.cohorts[0].families[0], "yes", "100", "1"]  # on by default
    attribute_only = next(c for c in pack.cohorts if not c.families)
    assert next(line for line in lines if line.startswith(attribute_only.id + " ")).split()[
        1:5
    ] == ["-", "no", "100", "1"]
    assert lines[-1] == "kill switch: released"
    # An actor's name is printed as given, not read as a Rich style.
    with remote.services.db.write_session() as s:
        canaries.flip_canary(
            session=s,
            cohort=stage.id,
            enabled=False,
            reason="x",
            actor="[bold]ops (token 7)",
            if_version=2,
        )
        s.commit()
    out = remote("canary", "list", env=narrow)[1]
    assert "[bold]ops (token 7)" in " ".join(out.split())


def test_kill_switch_and_demo_remove(remote: ServiceCli) -> None:
    code, out = remote("kill-switch", "engage", "--reason", "V2 crash loop")
    assert code == 0 and out.strip() == "kill switch ENGAGED"
    code, out = remote("kill-switch", "engage", "--reason", "V2 crash loop, again")
    assert code == 0 and out.strip() == "kill switch already ENGAGED; nothing changed (version 2)"
    services = Services.build(Settings(database_url=remote.db_url, demo=True))
    from turnout.dashboard.app import prepare

    prepare(services)  # an empty database: the demo fleet is recorded
    with services.db.read_session() as s:
        assert canaries.read_state(session=s).kill_switch is True
        num_demo = events.count_events(session=s, demo=True)
    assert num_demo > 0
    code, out = remote("demo", "remove", "--database-url", remote.db_url)  # on the database
    assert code == 0 and f"removed {num_demo} demo events" in out
    prepare(services)  # not seeded again
    with services.db.read_session() as s:
        assert events.count_events(session=s) == 0
        assert audit.list_entries(session=s)[0].action == "demo.remove"


def test_demo_seed_records_the_fleet_again_after_a_remove(run) -> None:  # type: ignore[no-untyped-def]
    from turnout.dashboard.app import prepare

    services = Services.build(Settings(database_url=run.url, demo=True))
    prepare(services)
    with services.db.read_session() as s:
        num_demo = events.count_events(session=s, demo=True)
    code, out = run("demo", "remove")
    assert code == 0 and "demo seed" in out  # says how to get it back
    code, out = run("demo", "seed")
    assert code == 0 and out.strip() == f"recorded {num_demo} demo events", out
    code, out = run("demo", "seed")  # twice: each event once
    assert code == 0 and out.strip() == f"recorded 0 demo events ({num_demo} were already there)"
    prepare(services)  # a start after a seed records nothing more
    with services.db.read_session() as s:
        assert events.count_events(session=s, demo=True) == num_demo
        entries = audit.list_entries(session=s)
    assert [e.action for e in entries[:3]] == ["demo.seed", "demo.seed", "demo.remove"]
    assert entries[1].after == {"events": num_demo, "already_there": 0}


def test_a_later_start_says_how_to_sign_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnout.dashboard.invocation import turnout_here

    script = tmp_path / ".venv" / "bin" / "turnout"  # make run's .venv/bin/turnout serve
    script.parent.mkdir(parents=True)
    script.write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [".venv/bin/turnout", "serve"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    turnout_here.cache_clear()
    services = _services(f"sqlite:///{tmp_path / 'again.db'}")
    services.db.upgrade()
    cli._first_admin_token(services, "http://127.0.0.1:8000")
    first = capsys.readouterr().out
    assert "first start, admin token (shown once): tok_" in first
    cli._first_admin_token(services, "http://127.0.0.1:8000")  # make run, again
    again = capsys.readouterr().out
    assert "tok_" not in again
    assert again.strip() == (
        "turnout: sign in at http://127.0.0.1:8000/login (lost the token? "
        ".venv/bin/turnout token create --role admin)"
    )
    # Served from a database given on the command line, the hint names it: without the flag
    # it made a token in the default database (found by a newcomer).
    cli._first_admin_token(services, "http://127.0.0.1:8000", " --database-url sqlite:///x.db")
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith(".venv/bin/turnout token create --role admin --database-url sqlite:///x.db)")
    )
    services.db.dispose()
    turnout_here.cache_clear()


def test_hints_name_the_turnout_the_user_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnout.dashboard.invocation import turnout_command

    script = tmp_path / "co" / ".venv" / "bin" / "turnout"
    script.parent.mkdir(parents=True)
    script.write_text("")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    checkout = tmp_path / "co"
    assert turnout_command(".venv/bin/turnout", cwd=checkout) == ".venv/bin/turnout"
    assert turnout_command(str(script), cwd=checkout) == ".venv/bin/turnout"
    assert turnout_command(str(script), cwd=tmp_path / "elsewhere") == str(script)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert turnout_command(str(script), cwd=tmp_path) == "turnout"


def test_serve_on_a_port_in_use_says_so_before_serving(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from turnout.oracle.cli import main; main()",
                "serve",
                "--port",
                str(port),
                "--database-url",
                f"sqlite:///{tmp_path / 's.db'}",
                "--no-demo",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "serving" not in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: "), done.stderr
    assert f"TURNOUT_PORT={port + 1} make run" in done.stderr


def _unusable_settings(tmp_path: Path) -> list[tuple[list[str], str]]:
    (tmp_path / "a-file").write_text("not a directory")
    pg = "postgresql+psycopg://postgres@127.0.0.1:5432/turnout_no_such_db"
    return [
        (
            ["--database-url", f"sqlite:///{tmp_path / 'a-file' / 'turnout.db'}"],
            f"the database sqlite:///{tmp_path / 'a-file' / 'turnout.db'} does not exist, and "
            "nothing was created",
        ),
        (["--database-url", "not-a-url"], "'not-a-url' is not a database URL"),
        # "cannot connect" where no PostgreSQL server answers
        (
            ["--database-url", pg],
            f"the database {pg} does not exist|cannot connect to the database {pg}",
        ),
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["db", "upgrade"],
        ["db", "current"],
        ["token", "create", "--role", "admin"],
        ["demo", "remove"],
    ],
)
def test_a_database_that_cannot_be_opened_is_an_error_not_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    app = typer.Typer()
    cli.register(app)
    for options, message in _unusable_settings(tmp_path):
        result = CliRunner().invoke(app, [*command, *options])
        assert result.exit_code == 1, (options, result.output, result.exception)
        assert any(result.output.startswith(f"error: {m}") for m in message.split("|")), (
            options,
            result.output,
        )
        assert not (tmp_path / "a-file").is_dir()
    if command[:2] in (["db", "upgrade"], ["token", "create"]):  # the two that take --create
        file_in_the_way = f"sqlite:///{tmp_path / 'a-file' / 'turnout.db'}"
        result = CliRunner().invoke(app, [*command, "--create", "--database-url", file_in_the_way])
        assert result.exit_code == 1 and result.output.startswith(
            f"error: cannot create the directory of the SQLite database {tmp_path / 'a-file'}"
        ), result.output
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert (
        CliRunner().invoke(app, ["db", "upgrade", "--create", "--database-url", url]).exit_code == 0
    )
    result = CliRunner().invoke(app, ["demo", "seed", "--pack", "nope", "--database-url", url])
    assert result.exit_code == 1 and result.output.startswith("error: no policy pack 'nope'")


@pytest.mark.parametrize(
    "command", [["canary", "list"], ["kill-switch", "engage", "--reason", "r"]]
)
def test_operator_commands_no_longer_take_the_database(tmp_path: Path, command: list[str]) -> None:
    app = typer.Typer()
    cli.register(app)
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    result = CliRunner().invoke(app, [*command, "--database-url", url])
    assert result.exit_code == 2, result.output
    assert "this command goes through the service now" in result.output
    assert not (tmp_path / "typo.db").exists()


def test_bad_input_exits_2_and_repeats_are_said(remote: ServiceCli) -> None:
    run = remote
    code, out = run("canary", "enable", "Llama", "--reason", "r")
    assert code == 2, out
    assert (
        "unknown cohort 'Llama' (did you mean the family 'llama'? its stage is cohort "
        "'llama-mistral-dense')" in out
    )
    code, out = run("canary", "enable", "QWEN3-canary", "--reason", "r")
    assert code == 2 and "(did you mean 'qwen3-canary'?)" in out, out
    code, out = run("kill-switch", "engage", "--reason", " ")
    assert code == 2, out
    code, out = run("token", "create", "--role", "viewer", "--name", "alice")
    first = out.splitlines()[0]
    code, out = run("token", "create", "--role", "viewer", "--name", "alice")
    assert code == 0 and out.splitlines()[0] != first
    with remote.services.db.read_session() as s:
        ids = [t.id for t in tokens.list_tokens(session=s) if t.name == "alice"]
    assert f"a token named 'alice' already exists (id {ids[0]}); created another" in out
    code, out = run("token", "revoke", str(ids[0]), "--reason", "rotated")
    assert code == 0 and out.strip() == f"token {ids[0]} (alice) revoked"
    code, out = run("token", "revoke", str(ids[0]), "--reason", "rotated")
    assert code == 0 and f"token {ids[0]} (alice) was already revoked (" in out
    assert out.strip().endswith("); nothing changed")
    code, out = run("token", "list")
    lines = out.splitlines()
    assert lines[0].split() == ["id", "prefix", "role", "state", "expires", "name"]
    assert [line.split()[3] for line in lines[1:] if line.endswith("alice")] == ["revoked", "live"]


def test_cli_reason_has_the_api_bounds(remote: ServiceCli) -> None:
    run = remote
    code, out = run("kill-switch", "engage", "--reason", "\u200b")
    assert code == 2 and "no visible text" in out
    code, out = run("kill-switch", "engage", "--reason", "y" * 2_001)
    assert code == 2 and "the reason is 2,001 characters; at most 2,000 are kept" in out
    code, out = run("kill-switch", "engage", "--reason", "y" * 2_000)
    assert code == 0 and out.strip() == "kill switch ENGAGED"


def test_token_create_expires_in(remote: ServiceCli) -> None:
    import datetime as dt

    run = remote
    code, out = run("token", "create", "--role", "viewer", "--name", "temp", "--expires-in", "30d")
    assert code == 0, out
    token = out.splitlines()[0].strip()
    assert ", expires 20" in out and " UTC; shown once)" in out
    with remote.services.db.read_session() as s:
        row = tokens.verify_token(session=s, token=token)
        assert row is not None and row.expires_at is not None
        left = row.expires_at - dt.datetime.now(dt.UTC)
        assert dt.timedelta(days=29, hours=23) < left <= dt.timedelta(days=30)
    code, out = run("token", "list")
    (line,) = [x for x in out.splitlines() if x.endswith("temp")]
    assert line.split()[3:5] == ["live", f"{row.expires_at:%Y-%m-%dT%H:%MZ}"]
    for bad in ("30", "1y", "0h", "3661d"):
        code, out = run("token", "create", "--role", "viewer", "--expires-in", bad)
        assert code == 2 and out.startswith(f"error: --expires-in '{bad}'"), out


def test_demo_decisions_split_a_partial_share_per_deployment(run) -> None:  # type: ignore[no-untyped-def]
    # A re-seed with a stage at 10 % recorded every deployment of it as outside the share: the
    # demo decided without the deployment id that a real engine's canary split hashes.
    from turnout.dashboard.demo import demo_events

    services = Services.build(Settings(database_url=run.url, demo=False))
    from turnout.dashboard.app import prepare

    prepare(services)
    with services.db.write_session() as s:
        version = canaries.get_canary(session=s, cohort="llama-mistral-dense").version
        canaries.flip_canary(
            session=s,
            cohort="llama-mistral-dense",
            enabled=True,
            percentage=50,
            reason="half",
            actor="ops",
            if_version=version,
        )
        s.commit()
    services.policy.invalidate()
    recorded, _ = demo_events(services)
    runners = {e.runner for e in recorded if e.stage == "llama-mistral-dense"}
    assert {"v1", "v2"} <= runners, runners  # some inside the share, some outside


def test_building_the_application_again_adds_nothing_to_the_canary_group() -> None:
    """``register`` once added ``canary ramp`` and ``canary schedule`` to the module-level
    ``canary`` group: every application a test built added them again, and `turnout decide`
    in the same worker took 0.8 s (Typer rebuilt hundreds of copies per call)."""
    from turnout.dashboard.cli import canary_app

    before = (len(canary_app.registered_groups), len(canary_app.registered_commands))
    for _ in range(3):
        cli.register(typer.Typer())
    assert (len(canary_app.registered_groups), len(canary_app.registered_commands)) == before
    assert [g.name for g in canary_app.registered_groups] == ["ramp"]


def test_db_retention_shows_sets_and_audits_the_day_bucket_retention(run) -> None:  # type: ignore[no-untyped-def]
    assert run("db", "upgrade", "--create")[0] == 0
    assert run("db", "retention") == (0, "day buckets are kept for good\n")
    code, out = run("db", "retention", "--days", "400")
    assert code == 0 and out == "day buckets were kept for good; now 400 days\n"
    assert run("db", "retention") == (0, "day buckets are kept 400 days\n")
    code, out = run("db", "retention", "--days", "400")
    assert code == 0 and out == "day buckets are kept 400 days already: nothing changed\n"
    code, out = run("db", "retention", "--forever")
    assert code == 0 and out == "day buckets were kept 400 days; now for good\n"
    for bad in (
        ["--days", "7"],
        ["--days", "36501"],
        ["--days", "x"],
        ["--days", "9", "--forever"],
    ):
        code, out = run("db", "retention", *bad)
        assert code == 2, (bad, out)
    assert run("db", "retention") == (0, "day buckets are kept for good\n")
    with _services(run.url).db.read_session() as s:
        changes = [
            (a.before, a.after)
            for a in s.scalars(select(AuditEntry).where(AuditEntry.action == "retention"))
        ]
        assert changes == [({"days": None}, {"days": 400}), ({"days": 400}, {"days": None})]
