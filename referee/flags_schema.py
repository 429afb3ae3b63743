"""The fields of the config classes behind vLLM's JSON-valued flags, as descriptors.

``--compilation-config``, ``--kv-transfer-config``, ``--attention-config`` ... are parsed by
``TypeAdapter(cls).validate_json`` of a pydantic dataclass (``parse_dataclass`` in
``vllm/engine/arg_utils.py``), so the parser refuses unknown keys (the ``@config`` decorator
forbids extras), values of the wrong type, and nested configs' unknown keys alike.
``--speculative-config`` is plain JSON in the parser and becomes ``SpeculativeConfig(**d)``
when the engine starts. Each class is written as ``{"fields": {name: {"type": D, "required":
bool, "validator": mode?}}, "extra": ...}`` where a type descriptor ``D`` is one of
``{"t": "int"|"float"|"bool"|"str"|"none"|"any"|"path"}``, ``{"t": "literal", "values"}``,
``{"t": "enum", "name", "names_ci"?}`` (its members under ``enums``), ``{"t": "list", "item"}``,
``{"t": "tuple", "items"}``, ``{"t": "dict", "value"}``, ``{"t": "union", "of"}``,
``{"t": "config", "name"}``; numeric bounds as ``gt``/``ge``/``lt``/``le``. A field whose
release validates it with its own code (a ``before``/``plain`` validator) is marked with
``"validator"``; for enums, whether the validator accepts member names case-insensitively is
found by trying it (``names_ci``).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import json
import pathlib
import types
import typing
from typing import Any

_SCALARS = {int: "int", float: "float", bool: "bool", str: "str", type(None): "none"}
_LISTS = (
    list,
    tuple,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.Set,
    collections.abc.Iterable,
    collections.abc.MutableSequence,
)
_DICTS = (
    dict,
    collections.abc.Mapping,
    collections.abc.MutableMapping,
    collections.Counter,
    collections.OrderedDict,
    collections.defaultdict,
)
_BOUNDS = ("gt", "ge", "lt", "le")


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


class Found:
    """The config classes and enums met while describing, by name."""

    def __init__(self, classes: dict[str, type]) -> None:
        self.configs = dict(classes)
        self.enums: dict[str, Any] = {}


def describe(tp: Any, found: Found) -> dict[str, Any]:
    """The descriptor of a type annotation; config dataclasses and enums met are added to
    ``found``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return {"t": "any"}
    if origin is typing.Annotated:
        if any(type(m).__name__ == "SkipValidation" for m in args[1:]):
            return {"t": "any", "was": "SkipValidation"}
        out = describe(args[0], found)
        for meta in args[1:]:
            out.update({b: getattr(meta, b) for b in _BOUNDS if hasattr(meta, b)})
        return out
    if origin in (typing.Union, types.UnionType):
        return {"t": "union", "of": [describe(a, found) for a in args]}
    if tp in _SCALARS:
        return {"t": _SCALARS[tp]}
    if origin is typing.Literal:
        return {"t": "literal", "values": [_jsonable(a) for a in args]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        found.enums.setdefault(
            tp.__name__,
            {
                "names": list(tp.__members__),
                "values": [_jsonable(m.value) for m in tp.__members__.values()],
                "int": issubclass(tp, int),
            },
        )
        return {"t": "enum", "name": tp.__name__}
    if isinstance(tp, type) and issubclass(tp, pathlib.PurePath):
        return {"t": "path"}
    if origin is tuple and args and Ellipsis not in args:
        return {"t": "tuple", "items": [describe(a, found) for a in args]}
    if tp in _LISTS or origin in _LISTS:
        return {"t": "list", "item": describe(args[0], found) if args else {"t": "any"}}
    if tp in _DICTS or origin in _DICTS or typing.is_typeddict(tp):
        value = args[1] if len(args) == 2 else Any
        return {"t": "dict", "value": describe(value, found)}
    if dataclasses.is_dataclass(tp) and hasattr(tp, "__pydantic_fields__"):
        found.configs.setdefault(tp.__name__, tp)
        return {"t": "config", "name": tp.__name__}
    return {"t": "any", "was": repr(tp)[:80]}


def _validators(cls: type) -> dict[str, set[str]]:
    """field -> the modes of the release's own validators of it that change what it accepts
    (``before``, ``plain``); ``wrap`` validators that only let ``None`` through are written as
    ``none_ok``."""
    out: dict[str, set[str]] = {}
    for name, dec in cls.__pydantic_decorators__.field_validators.items():
        mode = dec.info.mode
        if mode == "wrap" and "none" in name.lower():
            mode = "none_ok"
        elif mode not in ("before", "plain"):
            continue
        names = cls.__pydantic_fields__ if "*" in dec.info.fields else dec.info.fields
        for field in names:
            out.setdefault(field, set()).add(mode)
    return out


def _accepts(cls: type, data: dict[str, Any]) -> bool:
    from pydantic import TypeAdapter

    try:
        TypeAdapter(cls).validate_json(json.dumps(data))
    except Exception:  # whatever vLLM's parser would refuse, a crash included
        return False
    return True


def _field(cls: type, name: str, info: Any, validators: set[str], found: Found) -> dict[str, Any]:
    if any(type(m).__name__ == "SkipValidation" for m in info.metadata):
        return {"type": {"t": "any", "was": "SkipValidation"}, "required": info.is_required()}
    desc = describe(info.annotation, found)
    bounds = {
        b: getattr(m, b) for m in info.metadata for b in _BOUNDS if getattr(m, b, None) is not None
    }
    for part in desc["of"] if desc["t"] == "union" else [desc]:
        if part["t"] in ("int", "float"):  # pydantic bounds an Optional[int]'s int
            part.update(bounds)
    if "none_ok" in validators:
        desc = {"t": "union", "of": [desc, {"t": "none"}]}
    out: dict[str, Any] = {"type": desc, "required": info.is_required()}
    own = sorted(validators & {"before", "plain"})
    if own:
        out["validator"] = own[0]
        _probe_validator(cls, name, desc, found)
        kinds = _kinds(cls, name)
        if kinds is not None:
            out["accepts"] = kinds
    return out


# JSON values of each kind, to find which kinds a field's own validator lets through: a kind
# is accepted when one of its values is.
_KIND_PROBES: dict[str, tuple[Any, ...]] = {
    "null": (None,),
    "bool": (True, False),
    "int": (0, 1, 3),
    "float": (0.5,),
    "str": ("x", "auto", "none", "all", "1"),
    "list": ([], ["x"]),
    "dict": ({},),
}


def _kinds(cls: type, name: str) -> list[str] | None:
    """The JSON kinds (null, bool, int, float, str, list, dict) that field ``name`` accepts
    alone, tried on the class (None: the class refuses its own defaults)."""
    if not _accepts(cls, {}):
        return None
    return [
        kind
        for kind, values in _KIND_PROBES.items()
        if any(_accepts(cls, {name: v}) for v in values)
    ]


def _probe_validator(cls: type, name: str, desc: dict[str, Any], found: Found) -> None:
    """Find out, by trying the class, what its own validator of ``name`` accepts: enum
    members by name in any case (``names_ci``), literal values spelt in capitals with dashes
    (``normalise``)."""
    if not _accepts(cls, {}):
        return  # the class cannot be built from its defaults alone: nothing to compare with
    for part in desc["of"] if desc["t"] == "union" else [desc]:
        if part["t"] == "enum":
            member = found.enums[part["name"]]["names"][-1]
            part["names_ci"] = _accepts(cls, {name: member.lower()})
        elif part["t"] == "literal" and isinstance(part["values"][0], str):
            shouted = part["values"][0].upper().replace("_", "-")
            if _accepts(cls, {name: shouted}):
                part["normalise"] = "lower_dashes_to_underscores"


def schema(cls: type, found: Found) -> dict[str, Any]:
    """One config class: its init fields (name -> descriptor), pydantic's ``extra``."""
    validators = _validators(cls)
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    fields = {
        name: _field(cls, name, info, validators.get(name, set()), found)
        for name, info in cls.__pydantic_fields__.items()
        if name in init
    }
    config = getattr(cls, "__pydantic_config__", {}) or {}
    return {
        "module": cls.__module__,
        "fields": fields,
        "extra": config.get("extra", "ignore"),
        "model_validators": sorted(cls.__pydantic_decorators__.model_validators),
    }


def config_schemas(classes: dict[str, type]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(configs, enums)``: every class of ``classes`` and every config class nested in
    them, by name; the enums their fields use, by name."""
    found = Found(classes)
    out: dict[str, Any] = {}
    while len(out) < len(found.configs):
        for name, cls in list(found.configs.items()):
            if name not in out:
                out[name] = schema(cls, found)
    return dict(sorted(out.items())), dict(sorted(found.enums.items()))
