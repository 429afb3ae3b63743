"""``turnout`` commands of the service, registered through the ``turnout.cli`` entry-point group.

Heavy imports (SQLAlchemy, FastAPI, the store) happen inside the command bodies, so that
``turnout decide`` stays light.
"""

from __future__ import annotations

import getpass
import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from turnout.dashboard.services import Services

DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="TURNOUT_DATABASE_URL",
        help="SQLAlchemy URL (default: var/turnout.db in the source checkout, whatever the "
        "working directory)",
    ),
]
PackOpt = Annotated[
    str | None, typer.Option("--pack", envvar="TURNOUT_PACK", help="policy pack name or directory")
]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="why (goes to the audit log)")]

db_app = typer.Typer(help="The service's database (migrations).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens (stored hashed, shown once).", no_args_is_help=True)
canary_app = typer.Typer(help="Canary state per rollout cohort.", no_args_is_help=True)
kill_app = typer.Typer(help="The global kill switch.", no_args_is_help=True)
demo_app = typer.Typer(help="The first-run demo fleet.", no_args_is_help=True)


def _actor() -> str:
    return f"cli:{getpass.getuser()}"


def _services(database_url: str | None = None, pack: str | None = None, **extra: Any) -> Services:
    """The services of the settings, their database reachable; a setting that cannot be used
    (database, pack, a TURNOUT_* value) ends the command with what is wrong."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings
    from turnout.dashboard.store.errors import StoreError
    from turnout.oracle.errors import OracleError

    overrides = {
        k: v
        for k, v in {"database_url": database_url, "pack": pack, **extra}.items()
        if v is not None
    }
    try:
        services = Services.build(Settings(**overrides))
        services.db.check()
    except (StoreError, OracleError, ValidationError) as err:
        raise _fail(str(err)) from err
    except SettingsError as err:  # a JSON-valued TURNOUT_* variable that is not JSON
        field = re.search(r'field "(\w+)"', str(err))
        name = f"TURNOUT_{field.group(1).upper()}" if field else "a TURNOUT_* variable"
        raise _fail(f"{name} is not JSON ({err.__cause__ or err})") from err
    return services


def _prepared(database_url: str | None, pack: str | None = None) -> Services:
    from turnout.dashboard.app import prepare

    services = _services(database_url, pack, demo=False)
    prepare(services, as_service=False)
    return services


def _fail(message: str, code: int = 1) -> typer.Exit:
    """``error: message`` on stderr; exit 1 for what went wrong around the command (the
    database, the settings), ``BAD_INPUT`` for what was asked (as ``turnout decide``)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


BAD_INPUT = 2


def _store_fail(message: str, err: Exception) -> typer.Exit:
    """An unknown id or a refused change (no reason, no name, approving one's own request) is
    bad input, exit 2; the rest (a version conflict, the database) exit 1."""
    from turnout.dashboard.store.errors import InvalidChange, NotAllowed, NotFound

    refused = isinstance(err, NotFound | InvalidChange | NotAllowed)
    return _fail(message, BAD_INPUT if refused else 1)


def serve(
    host: Annotated[str | None, typer.Option(envvar="TURNOUT_HOST")] = None,
    port: Annotated[int | None, typer.Option(envvar="TURNOUT_PORT")] = None,
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
    demo: Annotated[bool, typer.Option(help="seed the demo fleet on an empty database")] = True,
    access_log: Annotated[bool, typer.Option(help="log every request")] = False,
    workers: Annotated[
        int,
        typer.Option(min=1, help="server processes (each keeps its own snapshot and token caches)"),
    ] = 1,
) -> None:
    """Start the rollout-control service (migrations, canary defaults, demo fleet, then HTTP)."""
    import os

    import uvicorn

    from turnout.dashboard.app import create_app, prepare
    from turnout.dashboard.invocation import turnout_here

    services = _services(database_url, pack, host=host, port=port, demo=demo)
    _check_port(services.settings.host, services.settings.port)
    num_demo = prepare(services)
    if num_demo:
        typer.echo(
            f"turnout: empty database: recorded {num_demo} demo decisions from "
            "policies/reference/vllm_recipes.jsonl (remove: "
            f"{turnout_here()} demo remove)"
        )
    settings = services.settings
    url = f"http://{settings.host}:{settings.port}"
    _first_admin_token(services, url)
    typer.echo(
        f"turnout: serving pack {settings.pack!r} from {_safe_url(settings.database_url)}"
        f" on {url}" + (f" with {workers} workers" if workers > 1 else "")
    )
    run = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": access_log,
    }
    if workers == 1:
        uvicorn.run(create_app(services=services), **run)  # type: ignore[arg-type]
        return
    # Worker processes build their app from the environment (the settings' only source).
    os.environ.update(
        {
            "TURNOUT_DATABASE_URL": settings.database_url,
            "TURNOUT_PACK": settings.pack,
            "TURNOUT_DEMO": "false",
        }
    )
    services.db.dispose()
    uvicorn.run("turnout.dashboard.app:create_app", factory=True, workers=workers, **run)  # type: ignore[arg-type]


def _check_port(host: str, port: int) -> None:
    """End the command with what to do when ``host:port`` cannot be listened on (another
    service there, no permission), before anything says "serving"."""
    import socket

    from turnout.dashboard.invocation import turnout_here

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
            0
        ][0]
        with socket.create_server((host, port), family=family):
            pass  # the server binds it again at once (SO_REUSEADDR, as uvicorn)
    except OSError as err:
        why = err.strerror or str(err)
        raise _fail(
            f"cannot listen on {host}:{port}: {why} (another `turnout serve`?); "
            f"use another port: TURNOUT_PORT={port + 1} make run, or "
            f"{turnout_here()} serve --port {port + 1}"
        ) from None


def _first_admin_token(services: Services, url: str) -> None:
    """On a database without a live token, make an admin token and print it once."""
    from turnout.dashboard.invocation import turnout_here
    from turnout.dashboard.store import tokens

    with services.db.write_session() as session:
        services.db.lock_startup(session)  # replicas starting at once: one first token
        if tokens.count_tokens(session=session) == 0:
            _row, token = tokens.create_token(
                session=session, name="first admin", role=tokens.Role.admin, actor="first start"
            )
            session.commit()
            typer.echo(
                f"turnout: first start, admin token (shown once): {token}\n"
                f"turnout: sign in at {url}/login"
            )
        else:  # a later start (make run again): the token scrolled away long ago
            typer.echo(
                f"turnout: sign in at {url}/login (lost the token? "
                f"{turnout_here()} token create --role admin)"
            )


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseOpt = None) -> None:
    """Apply every pending migration."""
    services = _services(database_url, demo=False)
    services.db.upgrade()
    typer.echo(
        f"database {_safe_url(services.settings.database_url)} at revision "
        f"{services.db.current_revision()}"
    )


@db_app.command("current")
def db_current(database_url: DatabaseOpt = None) -> None:
    """Print the database's migration revision."""
    typer.echo(_services(database_url, demo=False).db.current_revision() or "(empty)")


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="viewer | operator | admin")],
    name: Annotated[str, typer.Option(help="who or what uses it")] = "cli",
    expires_in: Annotated[
        str | None,
        typer.Option(
            "--expires-in", help="lifetime, e.g. 30d, 12h, 90m, 2w (default: never expires)"
        ),
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    try:
        parsed = tokens.Role(role)
    except ValueError:
        raise _fail(f"--role {role!r}: use viewer, operator or admin", BAD_INPUT) from None
    try:
        lifetime = tokens.parse_duration(expires_in) if expires_in is not None else None
    except StoreError as err:
        raise _fail(f"--expires-in {err}", BAD_INPUT) from None
    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            same = [
                t.id
                for t in tokens.list_tokens(session=session)
                if t.name == name.strip() and t.revoked_at is None
            ]
            row, token = tokens.create_token(
                session=session, name=name, role=parsed, actor=_actor(), expires_in=lifetime
            )
            session.commit()
    except StoreError as err:  # an empty name
        raise _store_fail(str(err), err) from err
    typer.echo(token)
    if same:  # allowed (a rotation keeps the old one until it is revoked), but said
        typer.echo(
            f"(a token named {row.name!r} already exists (id "
            f"{', '.join(map(str, same))}); created another)",
            err=True,
        )
    expiry = f"expires {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else "never expires"
    typer.echo(f"(token {row.id}, role {row.role}, {expiry}; shown once)", err=True)


@token_app.command("list")
def token_list(database_url: DatabaseOpt = None) -> None:
    """List tokens (prefixes only)."""
    from turnout.dashboard.store import tokens

    services = _prepared(database_url)
    with services.db.read_session() as session:
        typer.echo(f"{'id':>4}  {'prefix':<11}  {'role':<8}  {'state':<7}  {'expires':<17}  name")
        for t in tokens.list_tokens(session=session):
            state = "revoked" if t.revoked_at else "expired" if tokens.is_expired(t) else "live"
            expires = f"{t.expires_at:%Y-%m-%dT%H:%MZ}" if t.expires_at else "never"
            typer.echo(f"{t.id:>4}  {t.prefix}…  {t.role:<8}  {state:<7}  {expires:<17}  {t.name}")


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(min=1, max=2**63 - 1)],
    reason: ReasonOpt,
    database_url: DatabaseOpt = None,
) -> None:
    """Revoke a token by id."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            before = next(
                (t.revoked_at for t in tokens.list_tokens(session=session) if t.id == token_id),
                None,
            )
            row = tokens.revoke_token(
                session=session, token_id=token_id, actor=_actor(), reason=reason
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    if before is not None:
        typer.echo(
            f"token {token_id} ({row.name}) was already revoked "
            f"({before:%Y-%m-%d %H:%M}); nothing changed"
        )
    else:
        typer.echo(f"token {token_id} ({row.name}) revoked")


@canary_app.command("list")
def canary_list(database_url: DatabaseOpt = None, pack: PackOpt = None) -> None:
    """Every cohort's canary, in rollout order, and the kill switch."""
    from turnout.dashboard.store import canaries
    from turnout.oracle.cli.console import make_console

    services = _prepared(database_url, pack)
    families = services.policy.cohort_families()
    with services.db.read_session() as session:
        rows = sorted(
            canaries.list_canaries(session=session),
            key=lambda c: (services.policy.rollout_position(c.cohort), c.cohort),
        )
        ks = canaries.get_kill_switch(session=session)
    console = make_console()
    console.print(_canary_table(rows, families), highlight=False)
    console.print(f"kill switch: {'ENGAGED' if ks.engaged else 'released'}")


def _canary_table(rows: list[Any], families: dict[str, tuple[str, ...]]) -> Any:
    """The cohorts as a table that fits 80 columns: families and the last change wrap inside
    their cells; ids are never cut (``fold``). A stage that names no family ("-") takes the
    deployments its conditions match, whatever their family."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column("cohort", no_wrap=True)
    table.add_column("families", overflow="fold", ratio=1)
    table.add_column("enabled", no_wrap=True)
    table.add_column("%", justify="right", no_wrap=True)
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("last change", overflow="fold", ratio=1)
    for c in rows:
        table.add_row(
            escape(c.cohort),
            escape(", ".join(families.get(c.cohort, ())) or "-"),
            "yes" if c.enabled else "no",
            str(c.percentage),
            str(c.version),
            escape(f"{c.updated_at:%Y-%m-%d %H:%M} {c.updated_by}"),
        )
    return table


def _flip(
    cohort: str,
    enabled: bool,
    reason: str,
    percentage: int | None,
    database_url: str | None,
    pack: str | None,
) -> None:
    from turnout.dashboard.cli_rollout import flip

    flip(cohort, enabled, reason, percentage, database_url, pack)


@canary_app.command("enable")
def canary_enable(
    cohort: Annotated[str, typer.Argument(help="cohort id or family name")],
    reason: ReasonOpt,
    percentage: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=100,
            help="share of the stage's deployments on V2 (default: keep the stored share)",
        ),
    ] = None,
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
) -> None:
    """Turn a cohort's canary on (V2 for its auto deployments)."""
    _flip(cohort, True, reason, percentage, database_url, pack)


@canary_app.command("disable")
def canary_disable(
    cohort: Annotated[str, typer.Argument(help="cohort id or family name")],
    reason: ReasonOpt,
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
) -> None:
    """Turn a cohort's canary off (its auto deployments go back to V1)."""
    _flip(cohort, False, reason, None, database_url, pack)


def _kill(engaged: bool, reason: str, database_url: str | None) -> None:
    from turnout.dashboard.store import canaries
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            result = canaries.set_kill_switch(
                session=session, engaged=engaged, reason=reason, actor=_actor()
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    state = "ENGAGED" if engaged else "released"
    if result.changed:
        typer.echo(f"kill switch {state}")
    else:
        typer.echo(
            f"kill switch already {state}; nothing changed (version {result.kill_switch.version})"
        )


@kill_app.command("engage")
def kill_engage(reason: ReasonOpt, database_url: DatabaseOpt = None) -> None:
    """Send every auto deployment to V1 now."""
    _kill(True, reason, database_url)


@kill_app.command("release")
def kill_release(reason: ReasonOpt, database_url: DatabaseOpt = None) -> None:
    """Release the kill switch (cohort canaries apply again)."""
    _kill(False, reason, database_url)


@demo_app.command("remove")
def demo_remove(database_url: DatabaseOpt = None) -> None:
    """Delete every demo deployment and event (a later start does not seed them again;
    `turnout demo seed` does)."""
    from turnout.dashboard import demo
    from turnout.dashboard.invocation import turnout_here

    services = _prepared(database_url)
    num = demo.remove(services, actor=_actor())
    typer.echo(f"removed {num} demo events (record them again: {turnout_here()} demo seed)")


@demo_app.command("seed")
def demo_seed(database_url: DatabaseOpt = None, pack: PackOpt = None) -> None:
    """Record the demo fleet now (after `turnout demo remove`, or into a database that has
    other decisions); events already there are kept once."""
    from turnout.dashboard import demo

    services = _prepared(database_url, pack)
    num, kept = demo.seed(services, actor=_actor())
    typer.echo(f"recorded {num} demo events" + (f" ({kept} were already there)" if kept else ""))


def register(app: typer.Typer) -> None:
    """Add the service's commands to the ``turnout`` application."""
    app.command("serve")(serve)
    app.add_typer(db_app, name="db")
    app.add_typer(token_app, name="token")
    app.add_typer(canary_app, name="canary")
    app.add_typer(kill_app, name="kill-switch")
    app.add_typer(demo_app, name="demo")
    from turnout.dashboard import cli_notify, cli_rollout

    cli_rollout.register(app, canary_app)
    cli_notify.register(app)
