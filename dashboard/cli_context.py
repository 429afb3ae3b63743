"""``turnout context list|use|set``: the services the operator commands call, kept in the
config file (``dashboard.contexts``) as kubectl and gh keep theirs."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Annotated

import typer

from turnout.dashboard import contexts
from turnout.dashboard.cli_base import BAD_INPUT, fail

context_app = typer.Typer(
    help="Services the operator commands call (URL and token), in "
    "$XDG_CONFIG_HOME/turnout/config.yaml; TURNOUT_URL and TURNOUT_TOKEN win over the file's "
    "current context, --context over both.",
    no_args_is_help=True,
)
NameArg = Annotated[str, typer.Argument(help="the context's name")]


def _load() -> contexts.Config:
    try:
        return contexts.load(contexts.config_path(os.environ))
    except contexts.ConfigError as err:
        raise fail(str(err)) from None


@contextlib.contextmanager
def _editing() -> Iterator[contexts.Config]:
    """The contexts under the file's lock, written back when the block ends without error."""
    try:
        with contexts.editing(contexts.config_path(os.environ)) as config:
            yield config
            contexts.save(config)
    except contexts.ConfigError as err:
        raise fail(str(err)) from None


@context_app.command("list")
def context_list() -> None:
    """Every context (* the current one) and where its token comes from."""
    config = _load()
    if not config.contexts:
        typer.echo(f"no context in {config.path} (add one: turnout context set NAME --url URL)")
    for c in config.contexts.values():
        mark = "*" if c.name == config.current else " "
        typer.echo(f"{mark} {c.name}  {c.url}  token: {c.describe_token()}")
    given = os.environ.get(contexts.ENV_URL, "").strip()
    if given:
        typer.echo(
            f"({contexts.ENV_URL} is set: commands call {given}, not the current context, "
            "unless given --context)"
        )


@context_app.command("use")
def context_use(name: NameArg) -> None:
    """Make a context the current one."""
    with _editing() as config:
        if name not in config.contexts:
            known = ", ".join(config.contexts) or "none yet: turnout context set NAME --url URL"
            raise fail(f"no context {name!r} in {config.path} ({known})", BAD_INPUT)
        config.current = name
    typer.echo(f"current context: {name} ({config.contexts[name].url})")


@context_app.command("set")
def context_set(
    name: NameArg,
    url: Annotated[str, typer.Option(help="the service's base URL: https://turnout.internal")],
    token_env: Annotated[
        str | None,
        typer.Option(help="read the token from this variable when a command runs"),
    ] = None,
    token_stdin: Annotated[
        bool,
        typer.Option(
            "--token-stdin",
            help="keep the token read from stdin in the file (readable by you only)",
        ),
    ] = False,
) -> None:
    """Add or change a context (without --token-env or --token-stdin its token comes from
    TURNOUT_TOKEN); the first one becomes the current one."""
    if token_env is not None and token_stdin:
        raise fail("give --token-env or --token-stdin, not both", BAD_INPUT)
    token = None
    if token_stdin:  # a terminal is asked without echo; a pipe is read
        given = (
            typer.prompt("token", hide_input=True) if sys.stdin.isatty() else sys.stdin.readline()
        )
        token = given.strip()
    if token_stdin and not token:
        raise fail("--token-stdin: stdin held no token", BAD_INPUT)
    if token is not None and not contexts.TOKEN_PATTERN.fullmatch(token):
        raise fail(
            "--token-stdin: the token holds a space or a character a token never has (it is "
            "not shown, nor kept)",
            BAD_INPUT,
        )
    try:
        entry = contexts.Context(name, contexts.check_url(url), token, token_env)
        contexts.check_context(entry)
    except contexts.ConfigError as err:
        raise fail(str(err), BAD_INPUT) from None
    with _editing() as config:
        config.contexts[name] = entry
        became = config.current is None
        if became:
            config.current = name
    typer.echo(
        f"context {name}: {entry.url}, token: {entry.describe_token()}"
        + (" (the current context)" if became else f" (use it: turnout context use {name})")
    )


def register(app: typer.Typer) -> None:
    app.add_typer(context_app, name="context")
