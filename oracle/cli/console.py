"""The command line's Rich consoles and tables.

On a terminal, Rich fits the output to the terminal's width. On a pipe or a file (``| grep``, CI
logs) Rich would assume 80 columns and cut ids, models and reasons with an ellipsis; there the
console is wide enough that no line wraps. ``COLUMNS`` (a positive number) sets the width
either way. Table cells that must wrap fold onto the next line: a value is never replaced by an
ellipsis.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Wider than any line the commands print: a pipe gets every row and message on one line.
PIPE_WIDTH = 4096


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, ``PIPE_WIDTH`` when the stream is
    not a terminal, ``COLUMNS`` when set to a positive number (``COLUMNS=0``, which some
    shells and CI runners export, is ignored: Rich would print nothing in 0 columns)."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        return Console(stderr=stderr)  # Rich reads COLUMNS itself
    if _is_terminal(stream):
        # Given explicitly: Rich would take an unusable COLUMNS over the terminal's size.
        return Console(stderr=stderr, width=shutil.get_terminal_size().columns)
    return Console(stderr=stderr, width=PIPE_WIDTH)


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False


def folding_table(*headers: str, **options: Any) -> Table:
    """A Rich table whose cells wrap, and fold words longer than the column, instead of
    ending in an ellipsis."""
    table = Table(**options)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table
