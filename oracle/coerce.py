"""Value checks for DeploymentConfig fields: one per field kind (:data:`KIND_CHECKS`), and the
few a field declares for itself (``check=`` of :func:`oracle.fields.declare`); clear errors.
No field is named here: each field's declaration in :mod:`oracle.config` says which check it gets.

Lenient only where a real source needs it: a command line gives strings ("8", "true"), a JSON
spec may give ``1`` for an environment value. Anything else is refused with the field's name,
the value seen and what was expected.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.fields import Check, FieldInfo, Kind

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
# Bounds no real deployment comes near: a value beyond them is a mistake (or an attack on the
# service's caches), refused with the field's name rather than carried into JSON and storage.
MAX_INT = 2**31 - 1
MAX_STR = 1024  # characters of a string field, list item, env name or value
MAX_ITEMS = 64  # entries of a list field or of env


class FrozenMap(Mapping[str, Any]):
    """An immutable, hashable mapping with str keys: DeploymentConfig.env (str -> str) and
    JSON-object fields (values frozen by :func:`freeze_json`)."""

    __slots__ = ("_hash", "_items", "_map")

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._map: dict[str, Any] = dict(sorted((items or {}).items()))
        self._items = tuple(self._map.items())
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> Any:
        return self._map[key]

    def get(self, key: str, default: Any = None) -> Any:  # dict speed on the decide path
        return self._map.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._map) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({self._map!r})"


def suggest(name: str, options: list[str] | tuple[str, ...]) -> str:
    """' (did you mean x?)' when a close option exists, else ''."""
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _bad(info: FieldInfo, value: Any, expected: str) -> ConfigError:
    return ConfigError(
        f"{info.name}: expected {expected}, got {value!r}",
        code=ErrorCode.BAD_VALUE,
        field=info.name,
    )


def _to_bool(info: FieldInfo, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(info, value, "true or false")


def _to_int(info: FieldInfo, value: Any) -> int:
    if isinstance(value, bool):
        raise _bad(info, value, "an integer")
    if isinstance(value, int):
        out = value
    elif (
        isinstance(value, str)
        and value.strip().lstrip("+").isascii()
        and value.strip().lstrip("+").isdigit()
    ):
        out = int(value)  # ASCII digits only: "²".isdigit() is true, int("²") fails
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    else:
        raise _bad(info, value, "an integer")
    if out < info.minimum:
        raise _bad(info, value, f"an integer >= {info.minimum}")
    if out > MAX_INT:
        raise _bad(info, value, f"an integer <= {MAX_INT}")
    return out


def _to_float(info: FieldInfo, value: Any) -> float:
    if isinstance(value, bool):
        raise _bad(info, value, "a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise _bad(info, value, "a number") from None
    if not out >= 0:  # NaN too
        raise _bad(info, value, "a number >= 0")
    if out == math.inf:  # not JSON
        raise _bad(info, value, "a finite number")
    return out


def _to_enum(info: FieldInfo, value: Any) -> str:
    assert info.vocab is not None
    if not isinstance(value, str):
        raise _bad(info, value, "one of " + ", ".join(info.vocab))
    v = value.strip().lower().replace("-", "_")
    if v not in info.vocab:
        raise ConfigError(
            f"{info.name}: unknown value {value!r}{suggest(v, info.vocab)}; expected one of "
            + ", ".join(info.vocab),
            code=ErrorCode.BAD_VALUE,
            field=info.name,
        )
    return v


def _to_list(info: FieldInfo, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (_to_str(info, value),) if value else ()
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        if len(value) > MAX_ITEMS:
            raise _bad(info, f"a list of {len(value)}", f"at most {MAX_ITEMS} entries")
        return tuple(_to_str(info, v) for v in value)
    raise _bad(info, value, "a list of strings")


def _to_env(info: FieldInfo, value: Any) -> FrozenMap:
    if isinstance(value, FrozenMap):
        return value
    if not isinstance(value, Mapping):
        raise _bad(info, value, "a mapping of variable name to value")
    if len(value) > MAX_ITEMS:
        raise _bad(info, f"{len(value)} variables", f"at most {MAX_ITEMS}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, list | dict) or v is None:
            raise _bad(info, {k: v}, "string names and scalar values")
        out[_to_str(info, k)] = _to_str(info, str(v).lower() if isinstance(v, bool) else str(v))
    return FrozenMap(out)


def freeze_json(value: Any) -> Any:
    """A JSON value made hashable: objects become FrozenMap, arrays tuples."""
    if isinstance(value, Mapping):
        return FrozenMap({str(k): freeze_json(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze_json(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The JSON-ready form of a field value (FrozenMap -> dict, tuple -> list)."""
    if isinstance(value, FrozenMap):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


_JSON_SCALARS = (str, int, float, bool, type(None))


def _json_ok(value: Any, depth: int = 0) -> bool:
    if depth > 8:
        return False
    if isinstance(value, Mapping):
        return len(value) <= MAX_ITEMS and all(
            isinstance(k, str) and len(k) <= MAX_STR and _json_ok(v, depth + 1)
            for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return len(value) <= MAX_ITEMS and all(_json_ok(v, depth + 1) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= MAX_STR
    return isinstance(value, _JSON_SCALARS)


def _to_json(info: FieldInfo, value: Any) -> FrozenMap:
    if isinstance(value, FrozenMap):
        return value
    if isinstance(value, bool) or not isinstance(value, Mapping):
        raise _bad(
            info,
            value,
            'a JSON object such as {"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
        )
    if not _json_ok(value):
        raise _bad(
            info,
            "an object",
            f"string keys, JSON values, at most {MAX_ITEMS} entries "
            f"a level and {MAX_STR} characters a string",
        )
    return freeze_json(value)  # type: ignore[no-any-return]


def check_capability(info: FieldInfo, value: Any) -> str:
    """A compute capability ``major.minor`` ("9.0"); a bare integer below 20 is a major version
    (10 -> 10.0), from 20 on it is vLLM's ``to_int()`` form (90 -> 9.0, 100 -> 10.0)."""
    text = (
        str(value).strip()
        if isinstance(value, str | int | float) and not isinstance(value, bool)
        else ""
    )
    if text.isdigit():
        number = int(text)
        text = f"{number}.0" if number < 20 else f"{number // 10}.{number % 10}"
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit() and len(major) <= 2 and len(minor) <= 2):
        raise _bad(info, value, "a compute capability major.minor such as 9.0")
    return _to_enum(info, f"{int(major)}.{int(minor)}")


def _to_str(info: FieldInfo, value: Any) -> str:
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise _bad(
                info, f"{value[:40]}... ({len(value)} characters)", f"at most {MAX_STR} characters"
            )
        return value
    raise _bad(info, value, "a string")


def check_quantization(info: FieldInfo, value: Any) -> str:
    """A quantization method name, lower-cased; ``False`` and ``""`` mean ``"none"``."""
    if value is False:
        return "none"
    v = _to_str(info, value).strip().lower()
    return v or "none"


def check_speculative_method(info: FieldInfo, value: Any) -> str:
    """An enum value where model-specific MTP names (``deepseek_mtp``, ``qwen3_next_mtp``, ...)
    resolve to ``"mtp"``, as vLLM's SpeculativeConfig does (vllm/config/speculative.py)."""
    if isinstance(value, str) and value.strip().lower().replace("-", "_").endswith("_mtp"):
        return "mtp"
    return _to_enum(info, value)


KIND_CHECKS: dict[Kind, Check] = {
    "bool": _to_bool,
    "opt_bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "enum": _to_enum,
    "list": _to_list,
    "env": _to_env,
    "str": _to_str,
    "json": _to_json,
}
