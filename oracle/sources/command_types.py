"""The argparse ``type`` functions of ``vllm serve``, by the names flags.json gives them.

Each behaves as vLLM's own (``vllm/engine/arg_utils.py``, ``vllm/utils/argparse_utils.py``):
the same accepted spellings, the same exception (``ValueError`` -> argparse's
``invalid <name> value: 'x'``; ``ArgumentTypeError`` -> its own message) and the same
``__name__``, so argparse words a refusal as vLLM's parser does. Names: ``int``, ``float``,
``str``, ``json`` (``json.loads``), ``human_readable_int`` (``16k``, ``1G``),
``human_readable_int_or_auto`` (also ``auto``/``-1``), ``union_dict_and_str`` (a JSON object,
else the string), ``lower_dashes_to_underscores``, ``device_ids``, ``reasoning_parser``,
``optional(T)`` (``""``/``"None"`` -> None, else ``parse_type(T)``), ``parse_type(T)``
(``T``'s ValueError worded ``Value v cannot be converted to T.``) and ``dataclass(Config)``
(the JSON validated by the release's config class: :mod:`oracle.sources.command_configs`).
"""

from __future__ import annotations

import json
import re
from argparse import ArgumentTypeError
from collections.abc import Callable
from typing import Any

__all__ = ["ArgumentTypeError", "human_readable_int", "make_type"]

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_JSON_NUMBER = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")
_JSON_STRING = re.compile(r'("(?:[^"\\]|\\.)*")')

TypeFn = Callable[[str], Any]


def human_readable_int(value: str) -> int:
    """``1k`` -> 1000, ``1K`` -> 1024, ``25.6k`` -> 25600; decimals with a binary suffix are
    an ArgumentTypeError; anything else goes through ``int``."""
    value = value.strip()
    match = _HUMAN.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        try:
            return int(number) * _BINARY[suffix]
        except ValueError:
            raise ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to "
                f"use {number}{suffix.lower()} instead?"
            ) from None
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def expand_json_numbers(text: str) -> str:
    """``{"size": 80g}`` -> ``{"size": 80000000000}``: bare human-readable numbers outside
    JSON strings, as vLLM does before validating a config's JSON."""
    parts = _JSON_STRING.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = _JSON_NUMBER.sub(lambda m: str(human_readable_int(m.group())), parts[i])
    return "".join(parts)


def loads(val: str) -> Any:
    return json.loads(val)


def union_dict_and_str(val: str) -> Any:
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return optional_type(loads, "json")(val)


def _lower_dashes(s: str) -> str:
    return s.lower().replace("-", "_")


def _device_ids(s: str) -> list[int | str]:
    return [int(d) if d.isdigit() else d for d in (part.strip() for part in s.split(","))]


def parse_reasoning_parser(val: str) -> str:
    return "" if val.lower() == "none" else val


_lower_dashes.__name__ = _device_ids.__name__ = "<lambda>"
_REPR = {
    "int": "<class 'int'>",
    "float": "<class 'float'>",
    "str": "<class 'str'>",
    "json": "<function loads>",
}


def parse_type(fn: TypeFn, name: str) -> TypeFn:
    def _parse_type(val: str) -> Any:
        try:
            return fn(val)
        except ValueError:
            raise ArgumentTypeError(
                f"Value {val} cannot be converted to {_REPR.get(name, f'<function {name}>')}."
            ) from None

    return _parse_type


def optional_type(fn: TypeFn, name: str) -> TypeFn:
    def _optional_type(val: str) -> Any:
        if val == "" or val == "None":
            return None
        return parse_type(fn, name)(val)

    return _optional_type


_BASE: dict[str, TypeFn] = {
    "int": int,
    "float": float,
    "str": str,
    "json": loads,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "union_dict_and_str": union_dict_and_str,
    "lower_dashes_to_underscores": _lower_dashes,
    "device_ids": _device_ids,
    "reasoning_parser": parse_reasoning_parser,
}


def make_type(name: str | None, dataclass_type: Callable[[str], TypeFn]) -> TypeFn | None:
    """The callable for a table's type ``name`` (None: argparse's default, the string);
    ``dataclass_type(config_name)`` builds a ``dataclass(...)`` validator. Raises
    ValueError for a name the oracle does not implement (a table from a newer vLLM)."""
    if name is None:
        return None
    if name in _BASE:
        return _BASE[name]
    wrapped = re.fullmatch(r"(optional|parse_type|dataclass)\((.+)\)", name)
    if wrapped is None:
        raise ValueError(
            f"flags.json names an argparse type the oracle does not implement: "
            f"{name!r} (add it to oracle/sources/command_types.py)"
        )
    kind, inner = wrapped.groups()
    if kind == "dataclass":
        return dataclass_type(inner)
    fn = make_type(inner, dataclass_type)
    assert fn is not None
    return (optional_type if kind == "optional" else parse_type)(fn, inner)
