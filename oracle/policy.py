"""The resolution order of DESIGN §3.3, over a compiled pack.

1. rules that force V2 (an explicit pin to V1 is an error naming them, unless the rule
   overrides the pin, as vLLM's watermarking does);
2. the pin from the pack's runner variable: a pin to V2 with hard blockers is an error listing
   them all; a pin to V1 that V1 cannot serve is an error too;
3. prerequisites (Triton) and platform defaults (``prefers: v1``, skipped when V1 cannot serve);
4. blockers -> V1 with one warning listing every blocker (an error when V1 cannot serve either);
5. rollout: kill switch, then the cohort's canary and its sticky percentage;
6. otherwise V2.

:class:`Evaluator` memoises the Decision per outcome key (rule mask, pin, architecture,
canary state, matched values), so a config never seen before costs one generated ``match``
call plus a dictionary lookup.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from oracle.compile_types import ArchInfo, CompiledRule, CompiledStage, PackData, Template
from oracle.decision import CanaryOutcome, Decision, Message, Reason

_ROLLOUT_REF = "rollout.yaml"


def bucket(stage_id: str, deployment_id: str) -> int:
    """A deployment's sticky position 0..9999 in a stage's percentage split.

    Stable across processes and releases (BLAKE2b of "stage:deployment"), so raising the
    percentage only ever adds deployments: in <=> bucket < percentage * 100.
    """
    digest = hashlib.blake2b(f"{stage_id}:{deployment_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10000


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class Evaluator:
    """Resolves decisions for one compiled pack; thread-safe (shared state is append-only)."""

    def __init__(self, pd: PackData) -> None:
        self.pd = pd
        self.msgs = pd.messages
        rules = pd.rules

        def mask(pred: Any) -> int:
            return sum(1 << r.index for r in rules if pred(r))

        self.m_forces = mask(lambda r: r.effect == "forces_v2")
        self.m_blocks_v1 = mask(lambda r: r.effect == "blocks_v1")
        self.m_prereq = mask(lambda r: r.effect == "blocks_v2" and r.prerequisite)
        self.m_blockers = mask(lambda r: r.effect == "blocks_v2" and not r.prerequisite)
        self.m_hard = mask(lambda r: r.effect == "blocks_v2" and r.severity == "hard")
        self.m_prefers = mask(lambda r: r.effect == "prefers_v1")
        self.memo: dict[tuple[Any, ...], Decision] = {}
        self._facts: dict[tuple[int, tuple[Any, ...]], tuple[Reason, str, dict[str, Any]]] = {}

    # -- entry -------------------------------------------------------------------------------

    def resolve(self, c: Any, a: ArchInfo, pin: str, view: tuple[Any, ...],
                digest: str) -> Decision:
        """The Decision for config ``c`` of architecture ``a``, runner pin ``pin`` ("auto",
        "v1", "v2") and canary ``view`` (kill switch, then (enabled, percentage) per stage)."""
        pd = self.pd
        m, idx, values = pd.evaluate(c, a, pin)
        included = None
        if idx >= 0:
            enabled, pct = view[1 + idx]
            if enabled and pct < 100:
                dep = c.deployment_id
                included = dep is not None and bucket(pd.stages[idx].id, dep) < pct * 100
        key = (m, pin, id(a), idx, id(view), included, values)
        hit = self.memo.get(key)
        if hit is not None and hit.policy_digest is digest:
            return hit
        d = self._build(c, a, m, pin, idx, view, included, digest, values)
        if len(self.memo) > 200_000:
            self.memo.clear()
        self.memo[key] = d
        return d

    # -- resolution --------------------------------------------------------------------------

    def _rule_facts(self, rule: CompiledRule, vals: tuple[Any, ...]
                    ) -> tuple[Reason, str, dict[str, Any]]:
        """(Reason, rendered label, values by dimension) of a matched rule; memoised."""
        key = (rule.index, vals)
        hit = self._facts.get(key)
        if hit is None:
            values = dict(zip(rule.dims, vals, strict=True))
            label = rule.label.render(values)
            tested = {cond.dim: values[cond.dim] for cond in rule.conditions}
            hit = (Reason(rule.id, label, rule.severity, rule.effect, tested, rule.reference),
                   label, values)
            if len(self._facts) > 100_000:
                self._facts.clear()
            self._facts[key] = hit
        return hit

    def _values(self, x: _Ctx, rule: CompiledRule) -> dict[str, Any]:
        return x.facts[rule.index][2]

    def _reason(self, x: _Ctx, rule: CompiledRule) -> Reason:
        return x.facts[rule.index][0]

    def _rules(self, mask: int) -> list[CompiledRule]:
        return [self.pd.rules[i] for i in _bits(mask)]

    def _labels(self, x: _Ctx, mask: int) -> str:
        return ", ".join(x.facts[i][1] for i in _bits(mask))

    def _add_reasons(self, x: _Ctx, mask: int) -> None:
        x.reasons += [self._reason(x, r) for r in self._rules(mask)]

    @staticmethod
    def _emit(x: _Ctx, tpl: Template | None, **values: Any) -> None:
        if tpl is not None:
            x.messages.append(Message(tpl.level, tpl.render(values)))

    @staticmethod
    def _render(tpl: Template | None, **values: Any) -> str:
        return tpl.render(values) if tpl is not None else ""

    def _done(self, x: _Ctx, runner: str | None, code: str, error: str | None = None,
              error_code: str | None = None, canary: CanaryOutcome | None = None) -> Decision:
        if runner == "v2":
            self._emit(x, self.msgs["using_v2"])
        return Decision(runner, "auto" if x.p == "auto" else "pinned",  # type: ignore[arg-type]
                        x.a.family, x.stage.id if x.stage else None, canary,
                        tuple(x.reasons), tuple(x.messages), code,  # type: ignore[arg-type]
                        error, x.digest, error_code, self.pd.name)

    def _build(self, c: Any, a: ArchInfo, m: int, pin: str, idx: int,
               view: tuple[Any, ...], included: bool | None, digest: str,
               values: tuple[Any, ...] | None) -> Decision:
        x = _Ctx(c, a, pin, self.pd.stages[idx] if idx >= 0 else None, digest)
        offset = 0
        for i in _bits(m):  # values holds the matched rules' dimension values, in rule order
            rule = self.pd.rules[i]
            n = len(rule.dims)
            x.facts[i] = self._rule_facts(rule, values[offset:offset + n])  # type: ignore[index]
            offset += n
        forced = m & self.m_forces
        b1 = m & self.m_blocks_v1
        if forced:
            rules = self._rules(forced)
            self._add_reasons(x, forced)
            if pin == "v1":
                strict = [r for r in rules if not r.override_pin]
                if strict:
                    err = self._render(self.msgs["v1_blocked"], labels=", ".join(
                        r.label.render(self._values(x, r)) for r in strict))
                    return self._done(x, None, "ERROR", err, "pin_conflict")
                for r in rules:
                    self._emit(x, r.message, **self._values(x, r))
            return self._pinned_v2(x, m, "STATIC" if pin == "v2" else "TARGETING_MATCH")
        if pin == "v1":
            if b1:
                self._add_reasons(x, b1)
                err = self._render(self.msgs["v1_blocked"], labels=self._labels(x, b1))
                return self._done(x, None, "ERROR", err, "pin_conflict")
            x.reasons.append(self._pin_reason("v1"))
            self._emit(x, self.msgs["pinned_v1"], name=self.pd.env_var, value="0")
            return self._done(x, "v1", "STATIC")
        if pin == "v2":
            x.reasons.append(self._pin_reason("v2"))
            return self._pinned_v2(x, m, "STATIC")
        return self._auto(x, m, b1, view, included)

    def _pin_reason(self, runner: str) -> Reason:
        value = "1" if runner == "v2" else "0"
        return Reason(f"pin.{runner}", f"pinned to {runner.upper()} by {self.pd.env_var}={value}",
                      "hard", f"pins_{runner}", {self.pd.env_var: value}, "")

    def _pinned_v2(self, x: _Ctx, m: int, code: str) -> Decision:
        hard = m & self.m_hard
        if not hard:
            return self._done(x, "v2", code)
        self._add_reasons(x, hard)
        parts = [self._render(r.error, **self._values(x, r))
                 for r in self._rules(hard & self.m_prereq)]
        blockers = hard & ~self.m_prereq
        if blockers:
            parts.append(self._render(self.msgs["pinned_blocked"],
                                      labels=self._labels(x, blockers)))
        return self._done(x, None, "ERROR", " ".join(parts), "pin_conflict")

    def _fallback_v1(self, x: _Ctx, b1: int) -> Decision:
        if not b1:
            return self._done(x, "v1", "TARGETING_MATCH")
        self._add_reasons(x, b1)
        err = self._render(self.msgs["v1_blocked"], labels=self._labels(x, b1))
        return self._done(x, None, "ERROR", err, "no_runner")

    def _auto(self, x: _Ctx, m: int, b1: int, view: tuple[Any, ...],
              included: bool | None) -> Decision:
        prereq = m & self.m_prereq
        if prereq:
            for r in self._rules(prereq):
                x.reasons.append(self._reason(x, r))
                self._emit(x, r.message, **self._values(x, r))
            return self._fallback_v1(x, b1)
        prefers = m & self.m_prefers
        if prefers:
            for r in self._rules(prefers):
                values = self._values(x, r)
                if b1:
                    self._emit(x, r.skip_message, v1_labels=self._labels(x, b1), **values)
                else:
                    x.reasons.append(self._reason(x, r))
                    self._emit(x, r.message, **values)
            if not b1:
                return self._done(x, "v1", "TARGETING_MATCH")
        blockers = m & self.m_blockers
        if blockers:
            self._add_reasons(x, blockers)
            self._emit(x, self.msgs["blocked"], labels=self._labels(x, blockers))
            return self._fallback_v1(x, b1)
        if b1:
            self._add_reasons(x, b1)
            return self._done(x, "v2", "TARGETING_MATCH")
        return self._rollout(x, view, included)

    def _rollout(self, x: _Ctx, view: tuple[Any, ...], included: bool | None) -> Decision:
        a, stage = x.a, x.stage
        fam = {"family": a.family, "family_label": a.family_label}
        if view[0]:
            x.reasons.append(Reason("rollout.kill_switch", "the rollout kill switch is on",
                                    "soft", "rollout", {}, _ROLLOUT_REF))
            self._emit(x, self.msgs["kill_switch"])
            return self._done(x, "v1", "DISABLED")
        if stage is None:
            runner = self.pd.default_runner
            if runner == "v1":
                x.reasons.append(Reason("rollout.no_stage", "in no rollout stage", "soft",
                                        "rollout", {"family": a.family}, _ROLLOUT_REF))
                self._emit(x, self.msgs["no_stage"], runner=runner.upper(), **fam)
            return self._done(x, runner, "DEFAULT")
        enabled, pct = view[1 + stage.index]
        canary = CanaryOutcome(stage.id, enabled, pct, bool(enabled and (pct >= 100 or included)))
        names = {"stage": stage.id, "stage_label": stage.label, "percentage": pct, **fam}
        if not enabled:
            x.reasons.append(Reason(
                "rollout.stage_off", f"not yet enabled for V2 (stage {stage.label})", "soft",
                "rollout", {"family": a.family, "stage": stage.id}, _ROLLOUT_REF))
            self._emit(x, self.msgs["stage_off"], **names)
            return self._done(x, "v1", "DISABLED", canary=canary)
        if pct >= 100:
            return self._done(x, "v2", "TARGETING_MATCH", canary=canary)
        if included:
            return self._done(x, "v2", "SPLIT", canary=canary)
        x.reasons.append(Reason(
            "rollout.split_out", f"not in the {pct}% share of stage {stage.label} yet", "soft",
            "rollout", {"family": a.family, "stage": stage.id, "percentage": pct}, _ROLLOUT_REF))
        self._emit(x, self.msgs["split_out"], **names)
        return self._done(x, "v1", "SPLIT", canary=canary)


class _Ctx:
    """One resolution in progress: the inputs and the messages and reasons gathered so far."""

    __slots__ = ("a", "c", "digest", "facts", "messages", "p", "reasons", "stage")

    def __init__(self, c: Any, a: ArchInfo, p: str, stage: CompiledStage | None,
                 digest: str) -> None:
        self.c, self.a, self.p, self.stage, self.digest = c, a, p, stage, digest
        self.messages: list[Message] = []
        self.reasons: list[Reason] = []
        self.facts: dict[int, tuple[Reason, str, dict[str, Any]]] = {}


def default_view(stages: Sequence[CompiledStage], kill_switch: bool) -> tuple[Any, ...]:
    return (kill_switch, *((s.enabled, s.percentage) for s in stages))
