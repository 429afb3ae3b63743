"""How the person running the service invokes ``turnout``, for the commands hints print."""

from __future__ import annotations

import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path


def turnout_command(argv0: str | None = None, cwd: Path | None = None) -> str:
    """The command to print in a hint: ``turnout`` when PATH finds this very program, else
    its path as the user can type it from ``cwd`` (``.venv/bin/turnout`` after ``make run``
    from the checkout), else an absolute path. ``argv0`` defaults to ``sys.argv[0]``; when it
    is not a ``turnout`` script (tests, server worker processes), the ``turnout`` next to this
    Python is meant."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    here = (cwd or Path.cwd()).resolve()
    path = Path(argv0) if Path(argv0).name == "turnout" else Path(sys.executable).parent / "turnout"
    full = Path(os.path.abspath(here / path))  # the link itself, not what it points to
    if not full.exists():
        return "turnout"
    on_path = shutil.which("turnout")
    if on_path is not None and Path(on_path).resolve() == full.resolve():
        return "turnout"
    try:
        return str(full.relative_to(here))
    except ValueError:
        return str(full)


@lru_cache(maxsize=1)
def turnout_here() -> str:
    """:func:`turnout_command` of this process (computed once)."""
    return turnout_command()
