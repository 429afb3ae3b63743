"""Generate the pack's evaluation functions as straight-line Python.

``match(c, a)`` reads each used dimension once into a local, then tests every rule's
conditions and ORs the rule's bit into the mask; ``cohort(c, a)`` returns the first matching
stage. The source is kept on the pack (``Pack.compiled_source``) for inspection; the only
names it refers to are the frozensets bound in its own namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from oracle.compile_types import ArchInfo, CompiledRule, CompiledStage
from oracle.conditions import dimension_expr


def _local(dim: str) -> str:
    return f"v_{dim}"


def _conditions_source(conds: Sequence[Any], consts: dict[str, Any]) -> str:
    return " and ".join(f"({c.source(consts, _local(c.dim))})" for c in conds)


def generate(rules: Sequence[CompiledRule], stages: Sequence[CompiledStage]
             ) -> tuple[Callable[[Any, ArchInfo, str], int], Callable[[Any, ArchInfo, str], int],
                        dict[str, Callable[[Any, ArchInfo, str], Any]], str]:
    """(match, cohort, getters, source) for the given rules and stages."""
    consts: dict[str, Any] = {}
    rule_dims = sorted({c.dim for r in rules for c in r.conditions})
    lines = ["def match(c, a, p):"]
    lines += [f"    {_local(d)} = {dimension_expr(d)}" for d in rule_dims]
    lines.append("    m = 0")
    for r in rules:
        lines.append(f"    if {_conditions_source(r.conditions, consts)}:  # {r.id}")
        lines.append(f"        m |= {1 << r.index}")
    lines.append("    return m")

    stage_dims = sorted({c.dim for s in stages for c in s.conditions} | {"family"})
    lines.append("def cohort(c, a, p):")
    lines += [f"    {_local(d)} = {dimension_expr(d)}" for d in stage_dims]
    for s in stages:
        parts: list[str] = []
        if s.families:
            name = f"_F{len(consts)}"
            consts[name] = frozenset(s.families)
            parts.append(f"{_local('family')} in {name}")
        if s.conditions:
            parts.append(_conditions_source(s.conditions, consts))
        if parts:
            lines.append(f"    if {' and '.join(parts)}:  # {s.id}")
            lines.append(f"        return {s.index}")
        else:
            lines.append(f"    return {s.index}  # {s.id}")
            break
    else:
        lines.append("    return -1")

    all_dims = sorted({d for r in rules for d in r.dims} | set(stage_dims))
    for d in all_dims:
        lines.append(f"def get_{d}(c, a, p):")
        lines.append(f"    return {dimension_expr(d)}")
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = dict(consts)
    exec(compile(source, "<policy pack>", "exec"), namespace)  # our own generated code
    getters = {d: namespace[f"get_{d}"] for d in all_dims}
    return namespace["match"], namespace["cohort"], getters, source
