"""A pack's ``steps``: what the described engine does to a configuration before it decides.

vLLM does not decide on the configuration a user gives: ``VllmConfig.__post_init__`` first
changes values (``enforce_eager`` turns stock torch.compile off, the CPU platform turns dual
batch overlap off), refuses some combinations, and evaluates the selection early where the
async-scheduling default needs it, logging that early evaluation's warning even when the final
answer differs. A pack that describes such an engine lists those steps in order (docs/
policy-language.md); :func:`decide_with_steps` runs them, then the selection that counts
(:meth:`oracle.policy.Evaluator.resolve`), then the checks that follow it.

Values a step sets are checked when the pack is compiled; a decision works on one mutable copy
of the config's values (:class:`_State`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnout.oracle.compile_types import ArchInfo, CompiledStep, PackData
from turnout.oracle.config import CONFIG_FIELD_NAMES
from turnout.oracle.decision import Decision, Message, Reason
from turnout.oracle.errors import ErrorCode
from turnout.oracle.policy import Evaluator
from turnout.oracle.stepgen import StepProgram


def decide_with_steps(
    pd: PackData,
    ev: Evaluator,
    c: Any,
    a: ArchInfo,
    pin: str | None,
    pin_error: Decision | None,
    view: tuple[Any, ...],
    digest: str,
    applied: set[int] | None = None,
) -> Decision:
    """Run ``pd.steps`` on ``c``; ``pin`` is None when the runner variable is invalid, and
    ``pin_error`` is then the decision the first evaluation gives (vLLM reads the variable
    only when it evaluates the selection); ``view`` and ``digest`` are the canary view and
    policy digest the final selection resolves with (:meth:`Evaluator.resolve`). ``applied``
    collects the indices of the steps that applied (for coverage tests)."""
    if applied is None and pd.step_program is not None:
        return _compiled(pd, ev, c, a, pin, pin_error, view, digest)
    state, early = _state_of(c), None
    said: list[Message] = []
    p = pin if pin is not None else "invalid"
    decision: Decision | None = None
    applied = set() if applied is None else applied
    for step in pd.steps:
        if step.kind == "final":
            if pin_error is not None:
                return _with_messages(pin_error, said, pd.log_once)
            decision = _with_messages(ev.resolve(state, a, p, view, digest), said, pd.log_once)
            if decision.runner is None:
                return decision
            continue
        if (step.unless and step.unless & applied) or not step.test(state, a, p, early):
            continue
        applied.add(step.index)
        if step.kind == "set":
            for name, value in step.sets.items():
                setattr(state, name, value)
        elif step.kind == "refuse":
            return _refused(pd, step, state, a, p, early, said, decision, digest)
        else:
            if pin_error is not None:
                return _with_messages(pin_error, said, pd.log_once)
            assert pin is not None
            runner, lines, error = ev.select(state, a, pin)
            said += lines
            if error is not None:
                return _error_decision(
                    pd,
                    a,
                    p,
                    error,
                    said,
                    ErrorCode.PIN_CONFLICT,
                    Reason(SELECT_ERROR_ID, error, "hard", "error", {}, ""),
                    digest,
                )
            early = runner
    if decision is None:  # no final marker: the selection ends the steps
        if pin_error is not None:
            return _with_messages(pin_error, said, pd.log_once)
        decision = _with_messages(ev.resolve(state, a, p, view, digest), said, pd.log_once)
    return decision


def _compiled(
    pd: PackData,
    ev: Evaluator,
    c: Any,
    a: ArchInfo,
    pin: str | None,
    pin_error: Decision | None,
    view: tuple[Any, ...],
    digest: str,
) -> Decision:
    """:func:`decide_with_steps` through the pack's generated step program (same outcome)."""
    state = _state_of(c)
    said: list[Message] = []
    p = pin if pin is not None else "invalid"
    failed: list[str] = []

    def select(s: Any, index: int) -> str | None:
        if pin is None:
            return None
        runner, lines, error = ev.select(s, a, pin)
        said.extend(lines)
        if error is not None:
            failed.append(error)
            return None
        return runner

    code, index, early = pd.step_program.before(state, a, p, select)
    if code == 1:
        return _refused(pd, pd.steps[index], state, a, p, early, said, None, digest)
    if code == 2 or pin_error is not None:
        if failed:
            return _error_decision(
                pd,
                a,
                p,
                failed[0],
                said,
                ErrorCode.PIN_CONFLICT,
                Reason(SELECT_ERROR_ID, failed[0], "hard", "error", {}, ""),
                digest,
            )
        assert pin_error is not None
        return _with_messages(pin_error, said, pd.log_once)
    decision = _with_messages(ev.resolve(state, a, p, view, digest), said, pd.log_once)
    if decision.runner is None:
        return decision
    refuse = pd.step_program.after(state, a, p, early)
    if refuse >= 0:
        return _refused(pd, pd.steps[refuse], state, a, p, early, said, decision, digest)
    return decision


class _State:
    """One decision's working copy of a config's values, changed in place by ``set`` steps;
    the rules read it by attribute as they read a DeploymentConfig. Slots, filled by one
    generated function: a dict of 65 fields built from ``zip`` cost 3.3 µs a decision, the
    slots 0.5 µs (benchmarks/oracle_bench.py, cold)."""

    __slots__ = CONFIG_FIELD_NAMES


#: The rule id of a refusal by vLLM's runner selection (``Reason.rule_id``).
SELECT_ERROR_ID = "select.error"


def _state_maker() -> Callable[[Any], _State]:
    body = "".join(f"    s.{name} = c.{name}\n" for name in CONFIG_FIELD_NAMES)
    source = f"def state_of(c):\n    s = new(State)\n{body}    return s\n"
    ns: dict[str, Any] = {"new": object.__new__, "State": _State}
    exec(compile(source, "<oracle state copy>", "exec"), ns)  # our own generated code
    return ns["state_of"]  # type: ignore[no-any-return]


#: ``_state_of(c)``: a fresh :class:`_State` holding every field of ``c`` (a DeploymentConfig
#: or any object with its attributes, such as the matrix's probes).
_state_of = _state_maker()


def _dedupe(lines: list[Message]) -> list[Message]:
    seen: set[Message] = set()
    out = []
    for m in lines:
        if m not in seen:
            seen.add(m)
            out.append(m)
    return out


#: The position of ``messages`` in a Decision.
_MESSAGES = Decision._fields.index("messages")


def _with_messages(d: Decision, before: list[Message], once: bool) -> Decision:
    if not before:
        return d
    lines = [*before, *d.messages]
    # d._replace(messages=...) builds the tuple through _make and map: 3x the time
    kept = tuple(_dedupe(lines) if once else lines)
    return tuple.__new__(Decision, (*d[:_MESSAGES], kept, *d[_MESSAGES + 1 :]))


def _refused(
    pd: PackData,
    step: CompiledStep,
    state: Any,
    a: ArchInfo,
    p: str,
    early: str | None,
    said: list[Message],
    decision: Decision | None,
    digest: str,
) -> Decision:
    assert step.error is not None
    program: StepProgram = pd.step_program  # a pack with steps has its program
    values, matched = program.refusals[step.index](state, a, p, early)
    text = step.error.render(values)
    reason = Reason(f"step.{step.id}", text, "hard", "refuses", matched, step.reference)
    lines = said + (list(decision.messages) if decision is not None else [])
    return _error_decision(pd, a, p, text, lines, ErrorCode.REFUSED, reason, digest)


def _error_decision(
    pd: PackData,
    a: ArchInfo,
    p: str,
    text: str,
    lines: list[Message],
    code: ErrorCode,
    reason: Reason,
    digest: str,
) -> Decision:
    mode = "auto" if p == "auto" else "pinned"
    return Decision(
        None,
        mode,  # type: ignore[arg-type]
        a.family,
        None,
        None,
        (reason,),
        tuple(_dedupe(lines) if pd.log_once else lines),
        "ERROR",
        text,
        digest,
        code,
        pd.name,
    )
