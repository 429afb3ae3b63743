"""Conditions of rules and cohorts: parsed against the pack's dimensions, compiled to Python.

A ``when`` mapping ANDs one condition per dimension. A condition is a value (equal), a list
(one of), or a mapping of operators ``gt ge lt le`` and ``multiple_of not_multiple_of``
(numbers) and ``not`` (a value or a list). A numeric operator's operand is a number, the
name of another numeric dimension, or a product of such names: ``tensor_parallel_size:
{not_multiple_of: decode_context_parallel_size}`` is vLLM 0.29's ``tp % dcp != 0``, and
``decode_context_parallel_size: {ge: tensor_parallel_size*prefill_context_parallel_size}``
compares with ``tp * pcp`` (vllm/config/parallel.py).
Each condition becomes a Python expression over the config ``c`` and the architecture's
resolved family attributes ``a``; :mod:`oracle.compile` joins them into one function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from turnout.oracle.config import DEFAULTS, FIELD_INFO
from turnout.oracle.fields import DERIVED_DIMENSIONS, FAMILY_ATTRIBUTES
from turnout.oracle.yamlpos import PathKey, Positions

NOT_DIMENSIONS = {"env", "deployment_id", "model"}
_NUMERIC_OPS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_MULTIPLE_OPS = {"multiple_of": "==", "not_multiple_of": "!="}
_OPERATORS = "gt, ge, lt, le, multiple_of, not_multiple_of, not"


# The kv_transfer_config keys that are dimensions of their own.
KV_KEYS = ("kv_connector", "kv_role", "kv_connector_module_path")
# Built-in dimensions that read a value a condition may also find absent (None).
_NULLABLE_BUILTINS = {"kv_connector", "kv_role", "kv_connector_module_path", "early_runner"}


class OpenDomain(tuple[Any, ...]):
    """A string dimension's representative values (``open: true``): lint and the matrix use
    them, and a condition may name others."""

    __slots__ = ()


def dimension_kind(name: str, derived: AbstractSet[str] = frozenset()) -> str | None:
    """The value kind of dimension ``name`` (``derived``: the pack's own predicates), or None
    when it is not a dimension."""
    if name in derived or name in ("quantized", "pooling"):
        return "bool"
    if name in ("family", *KV_KEYS):
        return "str"
    if name in ("runner_pin", "early_runner"):
        return "enum"
    info = FIELD_INFO.get(name)
    if info is None or name in NOT_DIMENSIONS:
        return None
    return "bool" if info.kind == "opt_bool" else info.kind


def nullable(name: str) -> bool:
    """Whether a condition may test dimension ``name`` for ``null`` (a field whose default is
    None: "not set"; the kv_transfer_config keys without one; early_runner before any early
    evaluation)."""
    if name in _NULLABLE_BUILTINS:
        return True
    return name in DEFAULTS and DEFAULTS[name] is None


def dimension_expr(name: str, derived: AbstractSet[str] = frozenset()) -> str:
    """A Python expression reading dimension ``name`` from config ``c``, the architecture's
    attributes ``a``, the runner pin ``p`` and (in steps) the last early runner ``e``."""
    if name in derived:
        return f"_D_{name}(c, a, p)"
    if name in KV_KEYS:
        return f"(c.kv_transfer_config.get({name!r}) if c.kv_transfer_config is not None else None)"
    if name == "early_runner":
        return "e"
    if name in FAMILY_ATTRIBUTES:
        return f"(c.{name} if c.{name} is not None else a.{name})"
    if name == "family":
        return "a.family"  # a config's family override selects the family's own ArchInfo
    if name == "quantized":
        return "(c.quantization != 'none')"
    if name == "pooling":
        return f"({dimension_expr('runner_kind')} == 'pooling')"
    if name == "runner_pin":
        return "p"
    return f"c.{name}"


def known_dimension_names(derived: AbstractSet[str] = frozenset()) -> list[str]:
    return sorted(
        [n for n in FIELD_INFO if n not in NOT_DIMENSIONS]
        + list(DERIVED_DIMENSIONS)
        + list(derived)
    )


@dataclass(frozen=True)
class Condition:
    """One dimension's condition: ``ops`` is a tuple of (operator, operand)."""

    dim: str
    ops: tuple[tuple[str, Any], ...]

    @property
    def refs(self) -> tuple[str, ...]:
        """The other dimensions this condition reads (numeric operands naming dimensions)."""
        return tuple(
            factor
            for op, operand in self.ops
            if (op in _NUMERIC_OPS or op in _MULTIPLE_OPS) and isinstance(operand, str)
            for factor in operand.split("*")
        )

    def test(self, value: Any, other: Callable[[str], Any] | None = None) -> bool:
        """Evaluate on a plain value (lint, explain and the matrix use this). ``other`` reads
        another dimension's value; without it an operator comparing with another dimension
        counts as one that may hold."""
        for op, operand in self.ops:
            if op == "eq" and not _same(value, operand):
                return False
            if op == "in" and not any(_same(value, o) for o in operand):
                return False
            if op == "ne" and _same(value, operand):
                return False
            if op == "notin" and any(_same(value, o) for o in operand):
                return False
            if op in _NUMERIC_OPS or op in _MULTIPLE_OPS:
                if isinstance(operand, str):
                    if other is None:
                        continue
                    operand = product(operand, other)
                if not _numeric(op, value, operand):
                    return False
        return True

    def source(
        self,
        consts: dict[str, Any],
        expr: str | None = None,
        derived: AbstractSet[str] = frozenset(),
        local: Callable[[str], str] | None = None,
    ) -> str:
        """The Python expression; set operands are bound as names in ``consts``.

        ``expr`` replaces the dimension's reading expression (a hoisted local name); ``local``
        gives the hoisted name of a dimension an operand names (else it is read in place).
        """
        e = expr or dimension_expr(self.dim, derived)
        parts: list[str] = []
        for op, operand in self.ops:
            if op in ("in", "notin"):
                name = f"_K{len(consts)}"
                consts[name] = frozenset(operand)
                parts.append(f"{e} {'in' if op == 'in' else 'not in'} {name}")
            elif op in _NUMERIC_OPS or op in _MULTIPLE_OPS:
                # A field with a default is never None (DeploymentConfig checks its type): only
                # the nullable ones (model facts) need the guard, which costs a decision time.
                r = operand
                guards = [f"{e} is not None"] if nullable(self.dim) else []
                if isinstance(operand, str):
                    factors = operand.split("*")
                    reads = [local(f) if local else dimension_expr(f, derived) for f in factors]
                    guards += [
                        f"{x} is not None"
                        for f, x in zip(factors, reads, strict=True)
                        if nullable(f)
                    ]
                    r = reads[0] if len(reads) == 1 else f"({' * '.join(reads)})"
                    guards += [f"{r} != 0"] if op in _MULTIPLE_OPS else []
                if op in _NUMERIC_OPS:
                    test = f"{e} {_NUMERIC_OPS[op]} {r}"
                else:
                    test = f"{e} % {r} {_MULTIPLE_OPS[op]} 0"
                parts.append(" and ".join([*guards, test]))
            elif isinstance(operand, bool) or operand is None:
                parts.append(f"{e} is {'not ' if op == 'ne' else ''}{operand!r}")
            else:
                parts.append(f"{e} {'==' if op == 'eq' else '!='} {operand!r}")
        return " and ".join(f"({p})" for p in parts)


def product(operand: str, read: Callable[[str], Any]) -> Any:
    """The value of a dimension operand (``a`` or ``a*b``, each read with ``read``); None
    when a factor is unknown."""
    value: Any = 1
    for factor in operand.split("*"):
        one = read(factor)
        if one is None:
            return None
        value *= one
    return value


def arithmetic_names(placeholder: str) -> list[str]:
    """The dimensions a placeholder reads (``a``, ``a*b``, ``a//b``; oracle.stepgen renders
    them)."""
    return placeholder.replace("//", "*").split("*")


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b) if isinstance(a, bool) or isinstance(b, bool) else a == b


def _numeric(op: str, value: Any, operand: Any) -> bool:
    """A numeric operator on two values; an absent value (None) satisfies none of them, and
    nothing is a multiple of 0."""
    if value is None or operand is None:
        return False
    if op in _MULTIPLE_OPS:
        return bool(operand != 0 and (value % operand == 0) == (op == "multiple_of"))
    return bool(
        {
            "gt": value > operand,
            "ge": value >= operand,
            "lt": value < operand,
            "le": value <= operand,
        }[op]
    )


class ConditionParser:
    """Parses ``when`` mappings of one file, collecting issues instead of stopping at the first."""

    def __init__(
        self,
        domains: Mapping[str, tuple[Any, ...] | None],
        pos: Positions,
        derived: AbstractSet[str] = frozenset(),
        steps: bool = False,
    ) -> None:
        self.domains = domains
        self.pos = pos
        self.derived = derived
        self.steps = steps  # a step's condition may read early_runner
        self.issues: list[Any] = []

    def parse_when(self, when: Mapping[str, Any], path: PathKey) -> tuple[Condition, ...]:
        out: list[Condition] = []
        for dim, raw in when.items():
            cond = self._parse_one(dim, raw, (*path, dim))
            if cond is not None:
                out.append(cond)
        return tuple(out)

    def _fail(self, path: PathKey, message: str, *, key: bool = False) -> None:
        self.issues.append(self.pos.issue(path, message, prefer_key=key))

    def _parse_one(self, dim: str, raw: Any, path: PathKey) -> Condition | None:
        kind = dimension_kind(dim, self.derived)
        if kind is None:
            self._fail(
                path,
                f"unknown dimension {dim!r}; expected one of: "
                + ", ".join(known_dimension_names(self.derived)),
                key=True,
            )
            return None
        if dim == "early_runner" and not self.steps:
            self._fail(
                path,
                "early_runner is known only to steps (after an early "
                "evaluation), not to rules or stages",
                key=True,
            )
            return None
        if dim not in self.domains and dim not in self.derived:
            self._fail(
                path,
                f"dimension {dim!r} is not declared under 'dimensions' in capability_matrix.yaml",
                key=True,
            )
            return None
        before = len(self.issues)
        ops: list[tuple[str, Any]] | None
        if isinstance(raw, Mapping):
            ops = self._parse_ops(dim, kind, raw, path)
        elif isinstance(raw, list) and kind != "list":
            if not raw:
                self._fail(path, "an empty list matches nothing")
            ops = [("in", tuple(self._value(dim, kind, v, (*path, i)) for i, v in enumerate(raw)))]
        else:
            ops = [("eq", self._value(dim, kind, raw, path))]
        if ops is None or len(self.issues) > before:
            return None
        return Condition(dim, tuple(ops))

    def _parse_ops(
        self, dim: str, kind: str, raw: Mapping[str, Any], path: PathKey
    ) -> list[tuple[str, Any]] | None:
        ops: list[tuple[str, Any]] = []
        for op, operand in raw.items():
            p = (*path, op)
            if op in _NUMERIC_OPS or op in _MULTIPLE_OPS:
                whole = op in _MULTIPLE_OPS
                if kind not in (("int",) if whole else ("int", "float")):
                    need = "an integer" if whole else "a numeric"
                    self._fail(p, f"{op} needs {need} dimension; {dim!r} is {kind}", key=True)
                    return None
                checked = self._operand(op, operand, whole, p)
                if checked is None:
                    return None
                ops.append((op, checked))
            elif op == "not":
                if isinstance(operand, list) and kind != "list":
                    ops.append(
                        (
                            "notin",
                            tuple(
                                self._value(dim, kind, v, (*p, i)) for i, v in enumerate(operand)
                            ),
                        )
                    )
                else:
                    ops.append(("ne", self._value(dim, kind, operand, p)))
            else:
                self._fail(p, f"unknown operator {op!r}; expected one of: {_OPERATORS}", key=True)
                return None
        return ops

    def _operand(self, op: str, operand: Any, whole: bool, path: PathKey) -> Any:
        """A numeric operator's operand: a number (a positive integer for the multiple
        operators), the name of another numeric dimension of this pack, or a product of such
        names (``a*b``)."""
        factors = operand.split("*") if isinstance(operand, str) else []
        if factors and all(dimension_kind(f, self.derived) is not None for f in factors):
            for factor in factors:
                kind = dimension_kind(factor, self.derived)
                if kind not in (("int",) if whole else ("int", "float")) or (
                    factor not in self.domains
                ):
                    need = "an integer" if whole else "a numeric"
                    self._fail(path, f"{op}: {factor!r} is not {need} dimension of this pack")
                    return None
            return operand
        if isinstance(operand, bool) or not isinstance(operand, int | float):
            self._fail(path, f"{op} expects a number or a dimension's name, got {operand!r}")
            return None
        if whole and (not isinstance(operand, int) or operand < 1):
            self._fail(path, f"{op} expects a positive integer, got {operand!r}")
            return None
        return operand

    def _value(self, dim: str, kind: str, v: Any, path: PathKey) -> Any:
        if v is None:
            if nullable(dim):
                return None
            self._fail(path, f"{dim} is never null (it has a default); give a value")
            return _BAD
        if kind == "bool":
            if not isinstance(v, bool):
                self._fail(path, f"{dim} is a bool dimension; expected true or false, got {v!r}")
                return _BAD
            return v
        if kind in ("int", "float"):
            if isinstance(v, bool) or not isinstance(v, int | float):
                self._fail(path, f"{dim} expects a number, got {v!r}")
                return _BAD
            return v
        if kind == "list":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                self._fail(path, f"{dim} is a list dimension; expected a list of strings")
                return _BAD
            return tuple(v)
        domain = self.domains.get(dim)
        if not isinstance(v, str):
            self._fail(path, f"{dim} expects a string, got {v!r}")
            return _BAD
        if domain is not None and v not in domain and not isinstance(domain, OpenDomain):
            self._fail(
                path,
                f"unknown value {v!r} for {dim}; expected one of: "
                + ", ".join(str(d) for d in domain),
            )
            return _BAD
        return v


class _Bad:
    def __repr__(self) -> str:
        return "<invalid>"


_BAD: Any = _Bad()
