"""What an answer may echo of a request: bounded and encodable.

Strings are cut at ``MAX_ECHO_CHARS`` (a 60,000-character cohort name is not answered whole),
lists and objects at a few items, numbers of any size written as text, lone surrogates
(``"\\ud800"``: no character, not UTF-8) made U+FFFD and NaN or Infinity their names, so that
an error body can always be encoded. No FastAPI here: the store's messages use it too.
"""

from __future__ import annotations

import math
from typing import Any

MAX_ECHO_CHARS = 200  # of one string echoed back (a cohort name, a field's input)
_MAX_ITEMS = 10  # of a list or object echoed in ``input``
_MAX_DEPTH = 3
_MAX_INT_DIGITS = 30


def encodable(text: str) -> str:
    """``text`` with each lone surrogate (``"\\ud800"``: no character, not UTF-8) as U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` encodable and at most ``limit`` characters (``…`` and how many were cut)."""
    text = encodable(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def echo(value: Any, depth: int = 0) -> Any:
    """A bounded, encodable copy of a request value for an error body."""
    if isinstance(value, str):
        return clip(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return (
            value
            if abs(value) < 10**_MAX_INT_DIGITS
            else (f"an integer of more than {_MAX_INT_DIGITS} digits")
        )
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    if isinstance(value, BaseException):
        return clip(str(value))
    if depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        items = list(value.items())
        out = {clip(str(k)): echo(v, depth + 1) for k, v in items[:_MAX_ITEMS]}
        if len(items) > _MAX_ITEMS:
            out["…"] = f"{len(items) - _MAX_ITEMS} more keys"
        return out
    if isinstance(value, list | tuple):
        out_list = [echo(v, depth + 1) for v in value[:_MAX_ITEMS]]
        if len(value) > _MAX_ITEMS:
            out_list.append(f"… {len(value) - _MAX_ITEMS} more items")
        return out_list
    return clip(repr(value))
