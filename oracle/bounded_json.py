"""JSON from outside (a query parameter, a form field, a flag's value) parsed with its nesting
bounded.

``json.loads`` recurses once per level of nesting: 20,000 ``[`` raise RecursionError, which
callers that catch ``ValueError`` let through (a 500 on the explain page), and data a few
hundred levels deep that does parse can still exhaust the stack of later code that walks it.
No input turnout reads nests deeper than a handful of levels (a spec's ``compilation_config``
is the deepest, at 3), so ``loads`` refuses anything deeper than ``MAX_DEPTH`` before parsing.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting accepted (arrays and objects, counted from 1 for the outermost)."""

# A string, or an unterminated one to the end of the text (matched once: retrying from every
# quote of a long unterminated string took quadratic time). Possessive: no backtracking.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\Z)', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class TooDeepError(ValueError):
    """JSON nested deeper than the bound; a ValueError, as ``json.JSONDecodeError`` is."""


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text``, outside its strings
    (0 for a scalar). Brackets of a malformed document count as they stand: the parse that
    follows names what is wrong with it. Linear in ``len(text)``, and no Python loop per
    character (regular expressions, then ``accumulate`` over the brackets alone)."""
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub('""', text))
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` for text from outside (bytes are read as UTF-8).

    Raises:
        UnicodeDecodeError: bytes that are not UTF-8 (a ValueError).
        TooDeepError: arrays and objects nested deeper than ``max_depth`` (checked first).
        json.JSONDecodeError: not JSON, as ``json.loads`` raises it.
    """
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise TooDeepError(f"nested {depth} levels deep; at most {max_depth} are accepted")
    return json.loads(text)
