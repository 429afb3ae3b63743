"""``turnout engine serve``: registered through the ``turnout.cli`` entry points.

The flags are parsed by argparse (``turnout.serving.args``), not Typer, so that they are
named, abbreviated and refused as ``vllm serve`` does; the server and the engine are imported
only when the command runs, so other commands stay fast.
"""

from __future__ import annotations

import logging

import typer

engine_app = typer.Typer(
    name="engine",
    help="The runners as servers: `turnout engine serve MODEL` (OpenAI API).",
    no_args_is_help=True,
)


@engine_app.command(
    name="serve",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Serve MODEL over the OpenAI API (completions, chat, embeddings) with vLLM's metrics, on
    the runner the rollout chooses. `turnout engine serve --help` lists the flags."""
    from turnout.serving.args import parse_args
    from turnout.serving.server import serve as run_server

    args = parse_args(ctx.args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    raise typer.Exit(run_server(args))


def register(app: typer.Typer) -> None:
    """Entry point of ``turnout engine``."""
    app.add_typer(engine_app, name="engine")
