"""What the service's commands share: their options, their errors (``error: …`` and the exit
code), the service's API for the operator commands (``service()``: ``TURNOUT_URL`` and
``TURNOUT_TOKEN``, or a context), and the database for the bootstrap and upkeep ones.

Heavy imports (SQLAlchemy, the store, httpx) happen inside the functions, so that ``turnout
decide`` stays light.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.dashboard import contexts
from turnout.dashboard.invocation import turnout_here

if TYPE_CHECKING:
    from turnout.dashboard.remote import Remote
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
CreateOpt = Annotated[
    bool,
    typer.Option("--create", help="make the database when it does not exist (refused otherwise)"),
]
PackOpt = Annotated[
    str | None, typer.Option("--pack", envvar="TURNOUT_PACK", help="policy pack name or directory")
]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="why (goes to the audit log)")]
ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        help="a context of the config file (turnout context list); default: TURNOUT_URL and "
        "TURNOUT_TOKEN, else the file's current context",
    ),
]
# Operator commands once took the database; the option is kept (hidden) to say what changed.
ServiceOnlyOpt = Annotated[str | None, typer.Option("--database-url", hidden=True)]


def database_actor() -> str:
    """The audit actor of a change made on the database directly (bootstrap and upkeep): the
    login name, which nothing verifies; changes through the service carry the token's name."""
    return f"cli:{getpass.getuser()} (database)"


def open_services(
    database_url: str | None = None,
    pack: str | None = None,
    *,
    create: bool | None = None,
    offers_create: bool = False,
    **extra: Any,
) -> Services:
    """The services of the settings, their database reachable; a setting that cannot be used
    (database, pack, a TURNOUT_* value) ends the command with what is wrong. ``create``: None
    (``turnout serve``) opens the database as the service does (a SQLite file is made on first
    use); False ends the command, naming the URL, when the database does not exist; True
    makes it then (a PostgreSQL database too). ``offers_create``: the command has a
    ``--create`` flag (the refusal names it, else ``turnout db upgrade --create``). Raises
    typer.Exit."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings
    from turnout.dashboard.store import existence
    from turnout.dashboard.store.errors import StoreError
    from turnout.oracle.errors import OracleError

    overrides = {
        k: v
        for k, v in {"database_url": database_url, "pack": pack, **extra}.items()
        if v is not None
    }
    try:
        settings = Settings(**overrides)
        if create is not None and not existence.database_exists(settings.database_url):
            if not create:
                how = "--create" if offers_create else f"{turnout_here()} db upgrade --create"
                raise fail(
                    f"the database {safe_url(settings.database_url)} does not exist, and "
                    "nothing was created: check the URL (TURNOUT_DATABASE_URL, --database-url), "
                    f"or make a new database with {how}"
                )
            existence.create_database(settings.database_url)
        services = Services.build(settings)
        services.db.check()
    except ValidationError as err:
        message = _settings_error(err, set(overrides)) if err.title == "Settings" else str(err)
        raise fail(message) from err
    except (StoreError, OracleError) as err:
        raise fail(str(err)) from err
    except SettingsError as err:  # a JSON-valued TURNOUT_* variable that is not JSON
        field = re.search(r'field "(\w+)"', str(err))
        name = f"TURNOUT_{field.group(1).upper()}" if field else "a TURNOUT_* variable"
        raise fail(f"{name} is not JSON ({err.__cause__ or err})") from err
    return services


def _settings_error(err: Any, given: set[str]) -> str:
    """A settings validation error in the names the user wrote: ``--database-url`` for a value
    given on the command line, ``TURNOUT_FREEZE_HEAP`` for one from the environment (pydantic
    names the field, ``freeze_heap``, which appears nowhere the user looks)."""
    lines = []
    for e in err.errors():
        loc = [str(part) for part in e["loc"]]
        field = loc[0] if loc else ""
        name = f"--{field.replace('_', '-')}" if field in given else f"TURNOUT_{field.upper()}"
        if len(loc) > 1:  # inside a JSON-valued setting: the path in it too
            name = f"{name}: {'.'.join(loc)}"
        lines.append(f"{name}={e.get('input')!r}: {e['msg']}")
    return "; ".join(lines)


def prepared(
    database_url: str | None,
    pack: str | None = None,
    *,
    create: bool,
    offers_create: bool = False,
) -> Services:
    """The services of a direct-database command, migrated and with the canary defaults
    (``create``, ``offers_create``: as :func:`open_services`). Raises typer.Exit."""
    from turnout.dashboard.app import prepare

    services = open_services(
        database_url, pack, create=create, offers_create=offers_create, demo=False
    )
    prepare(services, as_service=False)
    return services


def fail(message: str, code: int = 1) -> typer.Exit:
    """``error: message`` on stderr; exit 1 for what went wrong around the command (the
    database, the settings, the service, the token), ``BAD_INPUT`` for what was asked (as
    ``turnout decide``)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


BAD_INPUT = 2


def store_fail(message: str, err: Exception) -> typer.Exit:
    """An unknown id or a refused change (no reason, no name) is bad input, exit 2; the rest
    (a version conflict, the database) exit 1."""
    from turnout.dashboard.store.errors import InvalidChange, NotAllowed, NotFound

    refused = isinstance(err, NotFound | InvalidChange | NotAllowed)
    return fail(message, BAD_INPUT if refused else 1)


def no_service() -> str:
    """What to say when no service is set: how to set one, and what still opens the
    database."""
    turnout = turnout_here()
    return (
        "no service to call: the operator commands go through the service's API with a token. "
        f"Set {contexts.ENV_URL} and {contexts.ENV_TOKEN} (export {contexts.ENV_URL}="
        f"http://127.0.0.1:8000 {contexts.ENV_TOKEN}=tok_…), or a context: {turnout} context "
        f"set NAME --url URL --token-env VARIABLE (it becomes the current one; {turnout} "
        "context --help). The database is opened directly only by `turnout db`, `turnout demo` "
        "and `turnout token create --role admin` (bootstrap)"
    )


def resolve_target(
    context: str | None, *, url: str | None = None, token: str | None = None
) -> contexts.Target | None:
    """The service of ``--context``, ``TURNOUT_URL`` or the current context (None: none).
    Raises typer.Exit (1) when the config file cannot be used or names no such context."""
    try:
        return contexts.resolve(os.environ, context, url=url, token=token)
    except contexts.ConfigError as err:
        raise fail(str(err)) from None


@contextmanager
def service(
    context: str | None,
    database_url: str | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
) -> Iterator[Remote]:
    """The service's API for an operator command; what it refuses ends the command with the
    service's message (exit 1 or 2: ``dashboard.remote``). ``database_url`` is the hidden
    ``--database-url`` of a command that no longer opens the database. Raises typer.Exit."""
    # httpx is imported by the commands that call the service only (turnout decide stays light)
    from turnout.dashboard.remote import Remote, RemoteError

    if database_url is not None:
        raise fail(
            "--database-url: this command goes through the service now, as the holder of a "
            f"token ({contexts.ENV_URL} and {contexts.ENV_TOKEN}, or --context); the database is "
            "opened directly only by `turnout db`, `turnout demo` and `turnout token create "
            "--role admin` (bootstrap)",
            BAD_INPUT,
        )
    target = resolve_target(context, url=url, token=token)
    if target is None:
        raise fail(no_service())
    try:
        with Remote(target) as remote:
            yield remote
    except RemoteError as err:
        raise fail(err.message, err.exit_code) from None


def parse_time(text: str) -> dt.datetime:
    """A time of the API's JSON (ISO 8601, ``Z`` or an offset; naive: UTC) in UTC."""
    when = dt.datetime.fromisoformat(text)
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def check_reason(reason: str) -> str:
    """``reason`` as the service takes it; one it refuses (no visible text, too long) ends
    the command (bad input) before anything is sent. Raises typer.Exit."""
    from turnout.dashboard.store import audit
    from turnout.dashboard.store.errors import StoreError

    try:
        audit.require_reason(reason)
    except StoreError as err:
        raise fail(str(err), BAD_INPUT) from None
    return reason


def safe_url(url: str) -> str:
    """A database URL without its password. Raises sqlalchemy's ArgumentError for one that
    does not parse."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def stages(api: Remote) -> list[dict[str, Any]]:
    """The service's rollout stages in order (``GET /stages``). Raises RemoteError, and
    typer.Exit when the answer is not a list of stages (not the turnout service)."""
    rows = api.get("/stages").body
    if not isinstance(rows, list) or not all(
        isinstance(s, dict)
        and isinstance(s.get("cohort"), str)
        and isinstance(s.get("families"), list)
        for s in rows
    ):
        raise fail(
            f"GET /stages of {api.target.url} answered JSON of another shape: is it the "
            "turnout service?"
        )
    return rows


def resolve_cohort(api: Remote, name: str) -> str:
    """A cohort id from a cohort id or a family name, with the service's pack (the first stage
    that names the family: ``qwen3`` → ``qwen3-canary``, said on stderr, so that ``--json``
    output stays JSON); other names come back unchanged, for the service to refuse with the
    cohorts it has. Raises RemoteError (typer.Exit: an answer of another shape)."""
    listed = stages(api)
    if any(s["cohort"] == name for s in listed):
        return name
    for s in listed:
        if name in s["families"]:
            typer.echo(f"{name}: the family's first rollout stage is {s['cohort']}", err=True)
            return str(s["cohort"])
    return name
