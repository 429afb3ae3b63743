"""Generate the pack's evaluation function as straight-line Python.

``evaluate(c, a, p)`` reads each dimension the rules and stages use once into a local (from
the config ``c``, the architecture's attributes ``a`` and the runner pin ``p``), tests every
rule's conditions and ORs the rule's bit into a mask, finds the first matching rollout stage,
and returns ``(mask, stage_index, values)`` where ``values`` are the dimension values of the
matched rules (the part of the outcome that depends on the config; None when nothing matched).
The source is kept on the pack (``Pack.compiled_source``); the only names it uses besides its
arguments are the frozensets bound in its own namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from turnout.oracle.compile_types import ArchInfo, CompiledRule, CompiledStage
from turnout.oracle.conditions import Condition, dimension_expr

Evaluate = Callable[[Any, ArchInfo, str], tuple[int, int, tuple[Any, ...] | None]]
Getter = Callable[[Any, ArchInfo, str], Any]


def _local(dim: str) -> str:
    return f"v_{dim}"


def _conditions_source(conds: Sequence[Condition], consts: dict[str, Any]) -> str:
    return " and ".join(f"({c.source(consts, _local(c.dim), local=_local)})" for c in conds)


def _inline_source(
    conds: Sequence[Condition], consts: dict[str, Any], derived: AbstractSet[str]
) -> str:
    """Conditions reading their dimensions directly (derived predicates and step tests)."""
    if not conds:
        return "True"
    return " and ".join(f"({c.source(consts, None, derived)})" for c in conds)


def _derived_lines(
    derived: Mapping[str, Sequence[Sequence[Condition]]], consts: dict[str, Any]
) -> list[str]:
    lines = []
    for name, alternatives in derived.items():
        body = (
            " or ".join(f"({_inline_source(alt, consts, frozenset())})" for alt in alternatives)
            or "False"
        )
        lines += [f"def _D_{name}(c, a, p):", f"    return {body}"]
    return lines


def _step_lines(
    steps: Sequence[Sequence[Condition]], consts: dict[str, Any], derived: AbstractSet[str]
) -> list[str]:
    lines = []
    for i, conds in enumerate(steps):
        lines += [
            f"def _S_{i}(c, a, p, e):",
            f"    return {_inline_source(conds, consts, derived)}",
        ]
    return lines


def _stage_lines(stages: Sequence[CompiledStage], consts: dict[str, Any]) -> list[str]:
    lines = ["    idx = -1"]
    keyword = "if"
    for s in stages:
        parts: list[str] = []
        if s.families:
            name = f"_F{len(consts)}"
            consts[name] = frozenset(s.families)
            parts.append(f"{_local('family')} in {name}")
        if s.conditions:
            parts.append(_conditions_source(s.conditions, consts))
        if not parts:
            lines.append(f"    {'else' if keyword == 'elif' else 'if True'}:  # {s.id}")
            lines.append(f"        idx = {s.index}")
            break
        lines.append(f"    {keyword} {' and '.join(parts)}:  # {s.id}")
        lines.append(f"        idx = {s.index}")
        keyword = "elif"
    return lines


def generate(
    rules: Sequence[CompiledRule],
    stages: Sequence[CompiledStage],
    derived: Mapping[str, Sequence[Sequence[Condition]]] | None = None,
    steps: Sequence[Sequence[Condition]] = (),
) -> Generated:
    """The evaluation function, getters, derived predicates and step tests of a pack, and
    their source."""
    consts: dict[str, Any] = {}
    derived = derived or {}
    names = frozenset(derived)
    hoisted = sorted(
        {d for r in rules for c in r.conditions for d in (c.dim, *c.refs)}
        | {d for s in stages for c in s.conditions for d in (c.dim, *c.refs)}
        | {"family"}
    )
    lines = _derived_lines(derived, consts) + _step_lines(steps, consts, names)
    lines.append("def evaluate(c, a, p):")
    lines += [f"    {_local(d)} = {dimension_expr(d, names)}" for d in hoisted]
    lines.append("    m = 0")
    for r in rules:
        lines.append(f"    if {_conditions_source(r.conditions, consts)}:  # {r.id}")
        lines.append(f"        m |= {1 << r.index}")
    lines += _stage_lines(stages, consts)
    lines.append("    if not m:")
    lines.append("        return 0, idx, None")
    lines.append("    out = ()")
    for r in rules:
        if r.dims:
            items = "".join(
                f"{_local(d) if d in hoisted else dimension_expr(d, names)}, " for d in r.dims
            )
            lines.append(f"    if m & {1 << r.index}:")
            lines.append(f"        out += ({items})")
    lines.append("    return m, idx, out")
    all_dims = sorted({d for r in rules for d in r.dims} | set(hoisted))
    for d in all_dims:
        lines.append(f"def get_{d}(c, a, p):")
        lines.append(f"    return {dimension_expr(d, names)}")
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = dict(consts)
    exec(compile(source, "<policy pack>", "exec"), namespace)  # our own generated code
    getters = {d: namespace[f"get_{d}"] for d in all_dims}
    return Generated(
        namespace["evaluate"],
        getters,
        source,
        {n: namespace[f"_D_{n}"] for n in derived},
        tuple(namespace[f"_S_{i}"] for i in range(len(steps))),
        namespace,
    )


class Generated(NamedTuple):
    evaluate: Evaluate
    getters: dict[str, Getter]
    source: str
    derived: dict[str, Getter]
    step_tests: tuple[Callable[[Any, ArchInfo, str, str | None], bool], ...]
    namespace: dict[str, Any]
