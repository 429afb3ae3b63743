"""The ``turnout`` command line (Typer + Rich).

The oracle owns the application object; other packages add their commands through the
``turnout.cli`` entry-point group (``register(app: typer.Typer) -> None``), so that the oracle
never imports the engine or the service, and ``turnout decide`` never loads torch. A plugin
module must import its heavy dependencies inside the command bodies.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

app = typer.Typer(
    name="turnout",
    help="Compatibility oracle and rollout control for LLM model runners.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


_plugins_registered = False


def _register_plugins() -> None:
    """Add the plugins' commands, once per process: ``main()`` called again (in-process
    callers, the test suite) added every plugin command again, and Typer rebuilds its whole
    command tree on each call (a suite's worker had ~270 commands, 0.8 s per call)."""
    global _plugins_registered
    if _plugins_registered:
        return
    _plugins_registered = True
    for ep in entry_points(group="turnout.cli"):
        try:
            register = ep.load()
        except ImportError as exc:  # a plugin whose extra is not installed
            name = ep.name

            def missing(exc: ImportError = exc, name: str = name) -> None:
                typer.echo(
                    f"turnout {name}: not available in this install ({exc}); "
                    f"install the matching extra, e.g. pip install 'turnout[service,runners]'",
                    err=True,
                )
                raise typer.Exit(2)

            app.command(name=name, help=f"(unavailable: {exc})")(missing)
            continue
        register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    _register_plugins()
    app(args=argv if argv is not None else sys.argv[1:], prog_name="turnout")


@app.callback()
def _root() -> None:
    """Compatibility oracle and rollout control for LLM model runners."""


def _register_oracle_commands() -> None:
    from turnout.oracle.cli.decide_cmd import decide
    from turnout.oracle.cli.launch import launch
    from turnout.oracle.cli.pack_cmds import explain, lint, matrix

    app.command(name="decide")(decide)
    # Everything from the vllm command on is vLLM's, with or without `--` (a vLLM flag such as
    # --config is not taken for launch's own).
    app.command(name="launch", context_settings={"allow_interspersed_args": False})(launch)
    app.command(name="explain")(explain)
    app.command(name="lint")(lint)
    app.command(name="matrix")(matrix)


_register_oracle_commands()
