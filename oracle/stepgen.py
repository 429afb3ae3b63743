"""A pack's steps compiled into straight-line Python, like its rules (oracle.codegen).

``before(c, a, p, select)`` runs the steps up to the final selection on the mutable state
``c`` (oracle.steps._State): a ``set`` step assigns its values, a ``refuse`` step returns, an
``evaluate`` step calls ``select(c, index)`` (the early selection; it returns the runner, or
None when the selection raised), and the function returns ``(code, index, early_runner)``:
code 0 at the final step (index: its position, or the number of steps without one), 1 for a
refusal, 2 for an early selection that raised. ``after(c, a, p, e)`` runs the checks after the
final step and returns the index of the first refusal that applies, or -1.

One generated function instead of a loop over step objects is what keeps a cold decision of a
release pack in the tens of microseconds (benchmarks/oracle_bench.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from turnout.oracle.compile_types import ArchInfo, CompiledStep
from turnout.oracle.conditions import Condition, dimension_expr

Before = Callable[
    [Any, ArchInfo, str, Callable[[Any, int], str | None]], tuple[int, int, str | None]
]
After = Callable[[Any, ArchInfo, str, str | None], int]


#: ``refusal(c, a, p, e) -> (placeholder values, matched values)`` of one refuse step
Refusal = Callable[[Any, ArchInfo, str, str | None], tuple[dict[str, Any], dict[str, Any]]]


class StepProgram(NamedTuple):
    before: Before
    after: After
    source: str
    #: per refuse step's index, its generated reader of the refusal's values
    refusals: dict[int, Refusal]


def _times(*values: Any) -> Any:
    """A product placeholder (``{tp*pcp}``): None when a factor is unknown."""
    out = 1
    for v in values:
        if v is None:
            return None
        out *= v
    return out


def _floordiv(num: Any, den: Any) -> Any:
    """A quotient placeholder (``{tp//kv}``): None when unknown or the divisor is 0."""
    return None if num is None or not den else num // den


def _value_expr(placeholder: str, derived: AbstractSet[str]) -> str:
    """The expression of a refusal placeholder: a dimension (``a``), a product (``a*b``) or a
    floor quotient (``a//b``, as vLLM's texts print ``tp // num_kv_heads``)."""
    if "//" in placeholder:
        num, den = placeholder.split("//", 1)
        return f"_floordiv({_dim(num, derived)}, {_dim(den, derived)})"
    if "*" in placeholder:
        return f"_times({', '.join(_dim(f, derived) for f in placeholder.split('*'))})"
    return _dim(placeholder, derived)


def _dim(name: str, derived: AbstractSet[str]) -> str:
    expr = dimension_expr(name, derived)
    # a name no reading knows (not a config field) reads as None
    return f"getattr(c, {name!r}, None)" if expr == f"c.{name}" else expr


def _refusal_lines(step: CompiledStep, derived: AbstractSet[str]) -> list[str]:
    values = ", ".join(f"{n!r}: {_value_expr(n, derived)}" for n in step.placeholders)
    matched = ", ".join(f"{d!r}: {_dim(d, derived)}" for d in step.reads)
    return [f"def _R_{step.index}(c, a, p, e):", f"    return {{{values}}}, {{{matched}}}"]


_CONST = re.compile(r"_[A-Z]\d+")  # a generated constant's name (oracle.codegen, conditions)
_DERIVED_DEF = re.compile(r"^def (_D_\w+)\(c, a, p\):\n    return (.*)$", re.MULTILINE)


def _inliner(rules_source: str) -> Callable[[str], str]:
    """A function that replaces each call of a derived predicate in a step's test with the
    predicate's own expression (oracle.codegen writes each as one ``return`` line)."""
    bodies = [
        (f"{name}(c, a, p)", f"({body})") for name, body in _DERIVED_DEF.findall(rules_source)
    ]

    def inline(test: str) -> str:
        for call, body in bodies:
            test = test.replace(call, body)
        return test

    return inline


def _test(conds: Sequence[Condition], consts: dict[str, Any], derived: AbstractSet[str]) -> str:
    if not conds:
        return "True"
    return " and ".join(f"({c.source(consts, None, derived)})" for c in conds)


def _guard(step: CompiledStep, consts: dict[str, Any], derived: AbstractSet[str]) -> str:
    test = _test(step.conditions, consts, derived)
    if step.unless:
        mask = sum(1 << i for i in step.unless)
        return f"not (m & {mask}) and {test}"
    return test


def generate_steps(
    steps: Sequence[CompiledStep],
    derived: AbstractSet[str],
    namespace: dict[str, Any],
    rules_source: str = "",
) -> StepProgram:
    """Compile ``steps`` (checked by oracle.compile) with the pack's derived predicates, which
    ``namespace`` (the rules' generated namespace, made from ``rules_source``) already
    defines. A derived predicate a step tests is inlined from its definition in
    ``rules_source``: a function call per predicate was a tenth of a cold decision."""
    # The rules' constants keep their names, and new ones are numbered after them.
    consts: dict[str, Any] = {k: v for k, v in namespace.items() if _CONST.fullmatch(k)}
    inline = _inliner(rules_source)
    remembered = {i for s in steps for i in s.unless}
    final = next((s.index for s in steps if s.kind == "final"), len(steps))
    lines = ["def before(c, a, p, select):", "    e = None", "    m = 0"]
    for s in steps[:final]:
        guard = inline(_guard(s, consts, derived))
        lines.append(f"    if {guard}:  # {s.id}")
        if s.kind == "set":
            for name, value in s.sets.items():
                key = f"_V{len(consts)}"
                consts[key] = value
                lines.append(f"        c.{name} = {key}")
        elif s.kind == "refuse":
            lines.append(f"        return 1, {s.index}, e")
        else:
            lines.append(f"        e = select(c, {s.index})")
            lines.append("        if e is None:")
            lines.append(f"            return 2, {s.index}, e")
        if s.index in remembered:
            lines.append(f"        m |= {1 << s.index}")
    lines.append(f"    return 0, {final}, e")
    lines.append("def after(c, a, p, e):")
    for s in steps[final + 1 :]:
        lines.append(f"    if {inline(_test(s.conditions, consts, derived))}:  # {s.id}")
        lines.append(f"        return {s.index}")
    lines.append("    return -1")
    refusing = [s for s in steps if s.kind == "refuse"]
    for s in refusing:
        lines += _refusal_lines(s, derived)
    source = "\n".join(lines) + "\n"
    ns = {**namespace, **consts, "_times": _times, "_floordiv": _floordiv}
    exec(compile(source, "<policy pack steps>", "exec"), ns)  # our own generated code
    refusals = {s.index: ns[f"_R_{s.index}"] for s in refusing}
    return StepProgram(ns["before"], ns["after"], source, refusals)
