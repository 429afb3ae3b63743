"""The JSON values of ``--compilation-config``, ``--kv-transfer-config``, ... validated as the
release's config classes validate them.

vLLM parses these flags with ``TypeAdapter(cls).validate_json`` of a pydantic dataclass that
forbids extra keys (``parse_dataclass``, ``vllm/engine/arg_utils.py``). The oracle rebuilds
each class from the table's field descriptors (:mod:`referee.flags_schema` writes them) as a
pydantic dataclass of the same name and validates with the same pydantic calls, so unknown
keys (nested ones too), wrong value types and missing required fields are refused in
pydantic's own words ("1 validation error for CompilationConfig / not_a_key / Unexpected
keyword argument"). Where a release checks a field with its own code (a ``before`` validator),
the oracle mirrors what the table says that code accepts (enum members by name in any case,
``-``/``_`` spellings) and otherwise accepts any value; the release's ``__post_init__`` and
model validators are not replayed (they check combinations, not the command line's shape).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from turnout.oracle.sources.command_types import ArgumentTypeError, TypeFn, expand_json_numbers

_SCALARS: dict[str, Any] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "none": type(None),
    "any": Any,
}
_BOUNDS = ("gt", "ge", "lt", "le")


def _names_ci(members: type[enum.Enum]) -> BeforeValidator:
    def by_name(value: Any) -> Any:
        if isinstance(value, str):
            name = value.upper()
            if name not in members.__members__:
                raise ValueError(
                    f"Invalid {members.__name__}: {value}. Valid names are: "
                    f"{', '.join(members.__members__)}"
                )
            return members[name]
        return value

    return BeforeValidator(by_name)


_KINDS: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("bool", bool),
    ("int", int),
    ("float", float),
    ("str", str),
    ("list", list),
    ("dict", dict),
    ("null", type(None)),
)


def _kind_of(value: Any) -> str:
    return next(kind for kind, tp in _KINDS if isinstance(value, tp))


def _only_kinds(kinds: frozenset[str]) -> BeforeValidator:
    """The JSON kinds a field's own validator was seen to let through (the table's
    ``accepts``): any other kind is refused."""

    def check(value: Any) -> Any:
        if _kind_of(value) not in kinds:
            raise ValueError(
                f"a {_kind_of(value)} is not accepted here (accepted: {', '.join(sorted(kinds))})"
            )
        return value

    return BeforeValidator(check)


def _normalised(value: Any) -> Any:
    return value.lower().replace("-", "_") if isinstance(value, str) else value


class ConfigValidators:
    """Builds (once) and runs the config classes of one flag table."""

    def __init__(self, configs: dict[str, Any], enums: dict[str, Any]) -> None:
        self._configs = configs
        self._enums = enums
        self._classes: dict[str, Any] = {}
        self._enum_classes: dict[str, type[enum.Enum]] = {}
        self._adapters: dict[str, TypeAdapter[Any]] = {}

    def _enum(self, name: str) -> type[enum.Enum]:
        if name not in self._enum_classes:
            spec = self._enums[name]
            values = [tuple(v) if isinstance(v, list) else v for v in spec["values"]]
            factory: Any = enum.IntEnum if spec["int"] else enum.Enum  # the functional API
            self._enum_classes[name] = factory(name, list(zip(spec["names"], values, strict=True)))
        return self._enum_classes[name]

    def annotation(self, desc: dict[str, Any], validator: str | None = None) -> Any:
        """The Python type of a field descriptor (see referee/flags_schema.py)."""
        t = desc["t"]
        if t in _SCALARS:
            bounds = {b: desc[b] for b in _BOUNDS if b in desc}
            return Annotated[_SCALARS[t], Field(**bounds)] if bounds else _SCALARS[t]
        if t == "path":
            return str
        if t == "literal":
            lit = Literal.__getitem__(tuple(desc["values"]))
            if validator and desc.get("normalise") == "lower_dashes_to_underscores":
                return Annotated[lit, BeforeValidator(_normalised)]
            return lit
        if t == "enum":
            members = self._enum(desc["name"])
            return Annotated[members, _names_ci(members)] if desc.get("names_ci") else members
        if t == "list":
            return list[self.annotation(desc["item"], validator)]  # type: ignore[misc]
        if t == "tuple":
            return tuple.__class_getitem__(tuple(self.annotation(d) for d in desc["items"]))
        if t == "dict":
            return dict[str, self.annotation(desc["value"], validator)]  # type: ignore[misc]
        if t == "union":
            return Union.__getitem__(tuple(self.annotation(d, validator) for d in desc["of"]))
        if t == "config":
            return self.config_class(desc["name"])
        return Any

    def _field_type(self, spec: dict[str, Any]) -> Any:
        desc, validator = spec["type"], spec.get("validator")
        if validator and not self._mirrors(desc):
            # the release's own code decides: the oracle checks only the kinds of JSON value
            # it was seen to accept
            if "accepts" in spec:
                return Annotated[Any, _only_kinds(frozenset(spec["accepts"]))]
            return Any
        return self.annotation(desc, validator)

    def _mirrors(self, desc: dict[str, Any]) -> bool:
        """Whether the oracle knows what a release's own validator accepts for ``desc``."""
        if desc["t"] == "union":
            return all(self._mirrors(d) for d in desc["of"])
        if desc["t"] == "enum":
            return bool(desc.get("names_ci"))
        if desc["t"] == "literal":
            return "normalise" in desc
        return desc["t"] in ("config", "none")

    def config_class(self, name: str) -> Any:
        """The pydantic dataclass standing for the release's config class ``name``."""
        if name in self._classes:
            return self._classes[name] or Any  # None: being built (a cycle)
        self._classes[name] = None
        spec = self._configs[name]
        fields: list[Any] = []
        for fname, fspec in spec["fields"].items():
            ann = self._field_type(fspec)
            fields.append(
                (fname, ann) if fspec["required"] else (fname, ann, dataclasses.field(default=None))
            )
        plain = dataclasses.make_dataclass(name, fields, kw_only=True)
        cls = pydantic.dataclasses.dataclass(
            plain, config=ConfigDict(extra=spec["extra"], arbitrary_types_allowed=True)
        )
        self._classes[name] = cls
        return cls

    def validate_json(self, name: str, text: str) -> None:
        """Raises pydantic's ValidationError where the release's class refuses ``text``."""
        if name not in self._adapters:
            self._adapters[name] = TypeAdapter(self.config_class(name))
        self._adapters[name].validate_json(text)

    def parse_type(self, name: str) -> TypeFn:
        """vLLM's ``parse_dataclass`` for config ``name``; returns the JSON value as given
        (a dict) once the class accepts it."""

        def parse_dataclass(val: str) -> Any:
            try:
                val = expand_json_numbers(val)
                self.validate_json(name, val)
            except ValidationError as exc:
                raise ArgumentTypeError(repr(exc)) from exc
            return json.loads(val)

        return parse_dataclass

    def unknown_keys(self, name: str, value: dict[str, Any]) -> list[str]:
        """The keys of ``value`` that config ``name`` has no field for (``-`` read as ``_``)."""
        known = self._configs[name]["fields"]
        return [k for k in value if k.replace("-", "_") not in known]
