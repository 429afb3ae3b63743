"""``turnout`` commands of the service, registered through the ``turnout.cli`` entry-point group.

The operator commands (``canary``, ``canary ramp``, ``canary schedule``, ``kill-switch``,
``approvals``, ``webhook``, ``evidence``, ``token``) call the service's API with a token
(``TURNOUT_URL`` and ``TURNOUT_TOKEN``, or a context: ``turnout context``), so that they go
through the same RBAC, If-Match versions and audit log as the pages, as the token's holder.
The database is opened directly only for bootstrap and upkeep: ``turnout serve``, ``turnout
db``, ``turnout demo`` and an admin token made on the database (``turnout token create --role
admin`` without a service); all but ``serve`` refuse a database that does not exist unless
``--create``.

Heavy imports (SQLAlchemy, FastAPI, the store, httpx) happen inside the command bodies, so
that ``turnout decide`` stays light.
"""

from __future__ import annotations

import datetime as dt
import shlex
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.dashboard import cli_context, cli_fleet, cli_notify, cli_rollout, contexts
from turnout.dashboard.cli_base import (
    BAD_INPUT,
    ContextOpt,
    CreateOpt,
    DatabaseOpt,
    PackOpt,
    ReasonOpt,
    ServiceOnlyOpt,
    check_reason,
    database_actor,
    fail,
    open_services,
    parse_time,
    prepared,
    resolve_cohort,
    resolve_target,
    safe_url,
    service,
    stages,
    store_fail,
)

if TYPE_CHECKING:
    from turnout.dashboard.services import Services

db_app = typer.Typer(help="The service's database (migrations).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens (stored hashed, shown once).", no_args_is_help=True)
canary_app = typer.Typer(help="Canary state per rollout cohort.", no_args_is_help=True)
kill_app = typer.Typer(help="The global kill switch.", no_args_is_help=True)
cli_rollout.extend_canary(canary_app)
demo_app = typer.Typer(help="The first-run demo fleet.", no_args_is_help=True)


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
    from turnout.dashboard.http_timeouts import TimedH11Protocol
    from turnout.dashboard.invocation import turnout_here

    services = open_services(database_url, pack, host=host, port=port, demo=demo)
    _check_port(services.settings.host, services.settings.port)
    # The hints below name this database when it was given here: run without the flag, they
    # would act on the default one.
    on_db = "" if database_url is None else f" --database-url {shlex.quote(safe_url(database_url))}"
    num_demo = prepare(services)
    if num_demo:
        typer.echo(
            f"turnout: empty database: recorded {num_demo} demo decisions from "
            "policies/reference/vllm_recipes.jsonl (remove: "
            f"{turnout_here()} demo remove{on_db})"
        )
    settings = services.settings
    url = f"http://{settings.host}:{settings.port}"
    _first_admin_token(services, url, on_db)
    typer.echo(
        f"turnout: serving pack {settings.pack!r} from {safe_url(settings.database_url)}"
        f" on {url}" + (f" with {workers} workers" if workers > 1 else "")
    )
    run = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": access_log,
        "http": TimedH11Protocol,  # header and body read timeouts (create_app sets them)
    }
    if workers == 1:
        uvicorn.run(create_app(services=services, freeze_heap=True), **run)  # type: ignore[arg-type]
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
    uvicorn.run("turnout.dashboard.app:create_served_app", factory=True, workers=workers, **run)  # type: ignore[arg-type]


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
        raise fail(
            f"cannot listen on {host}:{port}: {why} (another `turnout serve`?); "
            f"use another port: TURNOUT_PORT={port + 1} make run, or "
            f"{turnout_here()} serve --port {port + 1}"
        ) from None


def _first_admin_token(services: Services, url: str, on_db: str = "") -> None:
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
                f"{turnout_here()} token create --role admin{on_db})"
            )


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseOpt = None, create: CreateOpt = False) -> None:
    """Apply every pending migration (a database that does not exist: only with --create)."""
    services = open_services(database_url, create=create, offers_create=True, demo=False)
    services.db.upgrade()
    typer.echo(
        f"database {safe_url(services.settings.database_url)} at revision "
        f"{services.db.current_revision()}"
    )


@db_app.command("current")
def db_current(database_url: DatabaseOpt = None) -> None:
    """Print the database's migration revision."""
    typer.echo(
        open_services(database_url, create=False, demo=False).db.current_revision() or "(empty)"
    )


@db_app.command("cardinality")
def db_cardinality(
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
    compact: Annotated[
        bool,
        typer.Option(
            "--compact",
            help="prune expired buckets and rows at zero, and fold the reasons no shipped pack "
            "names into unknown_rule (the fallback totals stay)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """How many fallback-count rows (table latest_counts) and reasons the database holds, and
    the reasons no shipped pack names (stored before ingest checked rule ids against the
    pack). Give the pack the service runs when it is not a shipped one (--pack or
    TURNOUT_PACK): its own rules are foreign otherwise. On the database directly."""
    import json

    from turnout.dashboard.event_checks import known_reasons
    from turnout.dashboard.store import latest_counts

    services = prepared(database_url, pack, create=False)
    known = known_reasons(services.policy)
    out: dict[str, Any] = {}
    with services.db.write_session() as session:
        conn = session.connection()
        out["before"] = latest_counts.cardinality(conn, known).to_json()
        if compact:
            out["folded"] = latest_counts.compact(conn, dt.datetime.now(dt.UTC), known)
            out["after"] = latest_counts.cardinality(conn, known).to_json()
            session.commit()
    if as_json:
        typer.echo(json.dumps(out))
        return
    for when in ("before", "after"):
        if when in out:
            c = out[when]
            rows = ", ".join(f"{k} s: {v}" for k, v in c["num_rows"].items())
            typer.echo(
                f"{when}: rows by bucket size ({rows}); {c['num_zero_rows']} at zero; "
                f"{c['num_reasons']} reasons, {c['num_foreign_reasons']} named by no pack"
                + (f" (e.g. {', '.join(c['foreign_sample'][:3])})" if c["foreign_sample"] else "")
            )
    if compact:
        typer.echo(f"folded {out['folded']} reasons into {latest_counts.UNKNOWN_RULE}")
    elif out["before"]["num_foreign_reasons"]:
        typer.echo("fold them: turnout db cardinality --compact")


@db_app.command("retention")
def db_retention(
    database_url: DatabaseOpt = None,
    days: Annotated[
        int | None,
        typer.Option(
            "--days",
            min=8,
            max=36_500,
            help="keep the fallback counts' day buckets this many days (8 to 36500): "
            "deployments whose latest decision is older leave the counts (and the 'all' window)",
        ),
    ] = None,
    forever: Annotated[
        bool, typer.Option("--forever", help="keep the day buckets for good (the default)")
    ] = False,
) -> None:
    """Show or set how long the fallback counts keep their day buckets (table latest_counts;
    the finer buckets are kept 2 to 9 days whatever this says). Setting it is audited;
    lengthening it recounts the table from each deployment's latest decision. On the
    database directly."""
    from turnout.dashboard.store import audit, latest_counts

    if days is not None and forever:
        raise typer.BadParameter("give --days or --forever, not both")
    services = open_services(database_url, create=False, demo=False)
    with services.db.write_session() as session:
        conn = session.connection()
        before = latest_counts.day_retention_s(conn)
        shown = "for good" if before is None else f"{before // 86400} days"
        if days is None and not forever:
            typer.echo(f"day buckets are kept {shown}")
            return
        if (None if before is None else before // 86400) == days:
            typer.echo(f"day buckets are kept {shown} already: nothing changed")
            return
        latest_counts.set_day_retention(conn, days, dt.datetime.now(dt.UTC))
        audit.record(
            session=session,
            actor=database_actor(),
            action="retention",
            target="latest_counts:day_buckets",
            reason="turnout db retention",
            before={"days": None if before is None else before // 86400},
            after={"days": days},
        )
        session.commit()
    typer.echo(
        f"day buckets were kept {shown}; now {'for good' if days is None else f'{days} days'}"
    )


ROLES = ("viewer", "engine", "operator", "admin")


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    role: Annotated[
        str, typer.Option(help="viewer | engine (an engine fleet's reports) | operator | admin")
    ],
    name: Annotated[str, typer.Option(help="who or what uses it")] = "cli",
    expires_in: Annotated[
        str | None,
        typer.Option(
            "--expires-in", help="lifetime, e.g. 30d, 12h, 90m, 2w (default: never expires)"
        ),
    ] = None,
    context: ContextOpt = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            envvar="TURNOUT_DATABASE_URL",
            help="make an admin token on this database directly (bootstrap; default without a "
            "service: var/turnout.db in the source checkout)",
        ),
    ] = None,
    create: CreateOpt = False,
) -> None:
    """Create a token and print it once (only its hash is stored): through the service, as an
    admin; or an admin token on the database directly (bootstrap: the first admin, or one that
    replaces a lost token) when no service is set, or given --database-url or --create."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    if role not in ROLES:
        raise fail(f"--role {role!r}: use viewer, engine, operator or admin", BAD_INPUT)
    if not name.strip():
        raise fail("--name: a token needs a name (who or what uses it)", BAD_INPUT)
    try:
        if expires_in is not None:
            tokens.parse_duration(expires_in)
    except StoreError as err:
        raise fail(f"--expires-in {err}", BAD_INPUT) from None
    on_database = create or _given(ctx, "database_url")
    target = None if on_database else resolve_target(context)
    if target is None:
        _bootstrap_token(role, name, expires_in, database_url, create)
        return
    with service(context) as api:
        same = [
            t["id"]
            for t in api.get("/tokens").body
            if t["name"] == name.strip() and not t["revoked"]
        ]
        made = api.post("/tokens", {"name": name, "role": role, "expires_in": expires_in}).body
    _print_token(made["token"], made, same)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` was on the command line (not from its variable)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _bootstrap_token(
    role: str, name: str, expires_in: str | None, database_url: str | None, create: bool
) -> None:
    """An admin token made on the database directly. Raises typer.Exit for another role."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    if role != "admin":
        raise fail(
            f"{'an' if role[0] in 'aeiou' else 'a'} {role} token is made through the service, "
            "with an admin token: set "
            f"{contexts.ENV_URL} and {contexts.ENV_TOKEN} (or --context); on the database "
            "directly only an admin token is made (bootstrap: --role admin)",
            BAD_INPUT,
        )
    lifetime = tokens.parse_duration(expires_in) if expires_in is not None else None
    services = prepared(database_url, create=create, offers_create=True)
    try:
        with services.db.write_session() as session:
            same = [
                t.id
                for t in tokens.list_tokens(session=session)
                if t.name == name.strip() and t.revoked_at is None
            ]
            row, token = tokens.create_token(
                session=session,
                name=name,
                role=tokens.Role.admin,
                actor=database_actor(),
                expires_in=lifetime,
            )
            session.commit()
    except StoreError as err:  # an empty name
        raise store_fail(str(err), err) from err
    expires = row.expires_at.isoformat() if row.expires_at else None
    _print_token(
        token, {"id": row.id, "name": row.name, "role": row.role, "expires_at": expires}, same
    )


def _print_token(token: str, row: dict[str, Any], same: list[int]) -> None:
    typer.echo(token)
    if same:  # allowed (a rotation keeps the old one until it is revoked), but said
        typer.echo(
            f"(a token named {row['name']!r} already exists (id "
            f"{', '.join(map(str, same))}); created another)",
            err=True,
        )
    expiry = (
        f"expires {parse_time(row['expires_at']):%Y-%m-%d %H:%M} UTC"
        if row["expires_at"]
        else "never expires"
    )
    typer.echo(f"(token {row['id']}, role {row['role']}, {expiry}; shown once)", err=True)


@token_app.command("list")
def token_list(context: ContextOpt = None, database_url: ServiceOnlyOpt = None) -> None:
    """List tokens (prefixes only; admin)."""
    with service(context, database_url) as api:
        rows = api.get("/tokens").body
    now = dt.datetime.now(dt.UTC)
    typer.echo(f"{'id':>4}  {'prefix':<11}  {'role':<8}  {'state':<7}  {'expires':<17}  name")
    for t in rows:
        expires_at = parse_time(t["expires_at"]) if t["expires_at"] else None
        state = (
            "revoked"
            if t["revoked"]
            else "expired"
            if expires_at is not None and expires_at <= now
            else "live"
        )
        expires = f"{expires_at:%Y-%m-%dT%H:%MZ}" if expires_at else "never"
        typer.echo(
            f"{t['id']:>4}  {t['prefix']}…  {t['role']:<8}  {state:<7}  {expires:<17}  {t['name']}"
        )


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(min=1, max=2**63 - 1)],
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Revoke a token by id (admin; not the token making the call)."""
    check_reason(reason)
    with service(context, database_url) as api:
        before = next((t for t in api.get("/tokens").body if t["id"] == token_id), None)
        row = api.post(f"/tokens/{token_id}/revoke", {"reason": reason}).body
    if before is not None and before["revoked"]:
        when = (
            f" ({parse_time(before['revoked_at']):%Y-%m-%d %H:%M})"
            if before.get("revoked_at")
            else ""
        )
        typer.echo(f"token {token_id} ({row['name']}) was already revoked{when}; nothing changed")
    else:
        typer.echo(f"token {token_id} ({row['name']}) revoked")


@canary_app.command("list")
def canary_list(context: ContextOpt = None, database_url: ServiceOnlyOpt = None) -> None:
    """Every cohort's canary, in rollout order, and the kill switch."""
    from turnout.oracle.cli.console import make_console

    with service(context, database_url) as api:
        body = api.get("/canaries").body
        families = {s["cohort"]: s["families"] for s in stages(api)}
    console = make_console()
    console.print(_canary_table(body["cohorts"], families), highlight=False)
    console.print(f"kill switch: {'ENGAGED' if body['kill_switch']['engaged'] else 'released'}")


def _canary_table(rows: list[dict[str, Any]], families: dict[str, list[str]]) -> Any:
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
            escape(c["cohort"]),
            escape(", ".join(families.get(c["cohort"], ())) or "-"),
            "yes" if c["enabled"] else "no",
            str(c["percentage"]),
            str(c["version"]),
            escape(f"{parse_time(c['updated_at']):%Y-%m-%d %H:%M} {c['updated_by']}"),
        )
    return table


def _flip(
    cohort: str,
    enabled: bool,
    reason: str,
    percentage: int | None,
    context: str | None,
    database_url: str | None,
) -> None:
    """A flip now, or with approvals required and more of the cohort sent to V2, a request
    another operator approves (``PATCH /canaries/{cohort}`` with the version just read)."""
    check_reason(reason)
    with service(context, database_url) as api:
        cohort = resolve_cohort(api, cohort)
        version = api.get(f"/canaries/{cohort}").version()
        body: dict[str, Any] = {"enabled": enabled, "reason": reason}
        if percentage is not None:
            body["percentage"] = percentage
        done = api.patch(f"/canaries/{cohort}", body, if_match=version)
    if done.status == 202:
        flip_id = done.body["id"]
        typer.echo(
            f"{cohort}: waiting for another operator's approval (flip {flip_id}: "
            f"turnout approvals approve flip {flip_id} --reason …)"
        )
        return
    row = done.body
    state = f"enabled at {row['percentage']}%" if row["enabled"] else "disabled"
    if row["changed"]:
        typer.echo(f"{cohort}: {state} (version {row['version']})")
    else:
        typer.echo(f"{cohort}: already {state}; nothing changed (version {row['version']})")


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
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Turn a cohort's canary on (V2 for its auto deployments; operator)."""
    _flip(cohort, True, reason, percentage, context, database_url)


@canary_app.command("disable")
def canary_disable(
    cohort: Annotated[str, typer.Argument(help="cohort id or family name")],
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Turn a cohort's canary off (its auto deployments go back to V1; operator)."""
    _flip(cohort, False, reason, None, context, database_url)


def _kill(engaged: bool, reason: str, context: str | None, database_url: str | None) -> None:
    check_reason(reason)
    with service(context, database_url) as api:
        result = api.post("/kill-switch", {"engaged": engaged, "reason": reason}).body
    state = "ENGAGED" if engaged else "released"
    if result["changed"]:
        typer.echo(f"kill switch {state}")
    else:
        typer.echo(f"kill switch already {state}; nothing changed (version {result['version']})")


@kill_app.command("engage")
def kill_engage(
    reason: ReasonOpt, context: ContextOpt = None, database_url: ServiceOnlyOpt = None
) -> None:
    """Send every auto deployment to V1 now (operator)."""
    _kill(True, reason, context, database_url)


@kill_app.command("release")
def kill_release(
    reason: ReasonOpt, context: ContextOpt = None, database_url: ServiceOnlyOpt = None
) -> None:
    """Release the kill switch (cohort canaries apply again; operator)."""
    _kill(False, reason, context, database_url)


@demo_app.command("remove")
def demo_remove(database_url: DatabaseOpt = None) -> None:
    """Delete every demo deployment and event (a later start does not seed them again;
    `turnout demo seed` does). On the database directly."""
    from turnout.dashboard import demo
    from turnout.dashboard.invocation import turnout_here

    services = prepared(database_url, create=False)
    num = demo.remove(services, actor=database_actor())
    typer.echo(f"removed {num} demo events (record them again: {turnout_here()} demo seed)")


@demo_app.command("seed")
def demo_seed(database_url: DatabaseOpt = None, pack: PackOpt = None) -> None:
    """Record the demo fleet now (after `turnout demo remove`, or into a database that has
    other decisions); events already there are kept once. On the database directly."""
    from turnout.dashboard import demo

    services = prepared(database_url, pack, create=False)
    num, kept = demo.seed(services, actor=database_actor())
    typer.echo(f"recorded {num} demo events" + (f" ({kept} were already there)" if kept else ""))


def register(app: typer.Typer) -> None:
    """Add the service's commands to the ``turnout`` application."""
    app.command("serve")(serve)
    app.add_typer(db_app, name="db")
    app.add_typer(token_app, name="token")
    app.add_typer(canary_app, name="canary")
    app.add_typer(kill_app, name="kill-switch")
    app.add_typer(demo_app, name="demo")
    cli_rollout.register(app)
    cli_notify.register(app)
    cli_context.register(app)
    cli_fleet.register(app)
