"""``python -m turnout.serving MODEL [flags]``: ``turnout engine serve`` where turnout is not
installed as a distribution (a GPU machine running the tree with ``PYTHONPATH=src``: no entry
points there)."""

from __future__ import annotations

import logging
import sys

from turnout.serving.args import parse_args
from turnout.serving.server import serve

if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(serve(arguments))
