"""The resolution order of docs/architecture.md §3.3, over a compiled pack.

1. rules that force V2 (an explicit pin to V1 is an error naming them, unless the rule
   overrides the pin, as vLLM's watermarking does);
2. the pin from the pack's runner variable: a pin to V2 with hard blockers is an error listing
   them all; a pin to V1 that V1 cannot serve is an error too;
3. prerequisites (Triton) and platform defaults (``prefers: v1``, skipped when V1 cannot serve);
4. blockers -> V1 with one warning listing every blocker (an error when V1 cannot serve either);
5. rollout: kill switch, then the cohort's canary and its sticky percentage;
6. otherwise V2.

:class:`Evaluator` records each outcome shape (rule mask, pin, family, stage, canary state)
as a :class:`~oracle.plan.Plan` and memoises Decisions per shape and matched values, so a config
never seen before costs one generated ``evaluate`` call plus a lookup or a cheap instantiation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from turnout.oracle.compile_types import ArchInfo, CompiledRule, CompiledStage, PackData, Template
from turnout.oracle.decision import CanaryOutcome, Decision, Message, Reason
from turnout.oracle.errors import ErrorCode
from turnout.oracle.plan import Facts, Labels, Plan, Text, bits, instantiate

_ROLLOUT_REF = "rollout.yaml"

#: The rule ids of the rollout's own reasons and of the pins (``Reason.rule_id``); the pack's
#: matrix rules, steps and errors add theirs (``Pack.rule_ids``).
KILL_SWITCH_ID = "rollout.kill_switch"
NO_STAGE_ID = "rollout.no_stage"
STAGE_OFF_ID = "rollout.stage_off"
SPLIT_OUT_ID = "rollout.split_out"
ROLLOUT_RULE_IDS = (KILL_SWITCH_ID, NO_STAGE_ID, STAGE_OFF_ID, SPLIT_OUT_ID)
PIN_RULE_IDS = ("pin.v1", "pin.v2")


def bucket(stage_id: str, deployment_id: str) -> int:
    """A deployment's sticky position 0..9999 in a stage's percentage split.

    Stable across processes and releases (BLAKE2b of "stage:deployment"), so raising the
    percentage only ever adds deployments: in <=> bucket < percentage * 100.
    """
    digest = hashlib.blake2b(f"{stage_id}:{deployment_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10000


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
        self.plans: dict[tuple[Any, ...], Plan] = {}
        self._facts: dict[tuple[int, tuple[Any, ...]], tuple[Reason, str, dict[str, Any]]] = {}
        self._selected: dict[
            tuple[Any, ...], tuple[str | None, tuple[Message, ...], str | None]
        ] = {}

    # -- entry -------------------------------------------------------------------------------

    def resolve(
        self, c: Any, a: ArchInfo, pin: str, view: tuple[Any, ...], digest: str
    ) -> Decision:
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
        # The Decision depends on the architecture only through its family and the matched
        # rules' values (an architecture a rule tests is among them). A pin's reason and
        # message show the variable's value as set ("2" pins V2 where vLLM reads it as an
        # int): part of the shape, so a plan made for "1" never reads "=1" for "2".
        raw = c.env.get(pd.env_var) if pin != "auto" else None
        shape = (m, pin, a.family, idx, id(view), included, raw)
        key = (shape, values)
        hit = self.memo.get(key)
        if hit is not None and hit.policy_digest is digest:
            return hit
        plan = self.plans.get(shape)
        if plan is None or plan.policy_digest is not digest:
            plan = self._plan(a, m, pin, idx, view, included, digest, raw)
            self.plans[shape] = plan
        d = instantiate(plan, self._facts_of(m, values) if m else {})
        if len(self.memo) > 200_000:
            self.memo.clear()
        self.memo[key] = d
        return d

    def _facts_of(self, m: int, values: tuple[Any, ...] | None) -> Facts:
        """Per matched rule, its facts; ``values`` holds their dimension values in rule order."""
        facts = {}
        offset = 0
        for i in bits(m):
            rule = self.pd.rules[i]
            n = len(rule.dims)
            facts[i] = self._rule_facts(rule, values[offset : offset + n])  # type: ignore[index]
            offset += n
        return facts

    def _rule_facts(
        self, rule: CompiledRule, vals: tuple[Any, ...]
    ) -> tuple[Reason, str, dict[str, Any]]:
        """(Reason, rendered label, values by dimension) of a matched rule; memoised."""
        key = (rule.index, vals)
        hit = self._facts.get(key)
        if hit is None:
            values = dict(zip(rule.dims, vals, strict=True))
            label = rule.label.render(values)
            tested = {cond.dim: values[cond.dim] for cond in rule.conditions}
            hit = (
                Reason(rule.id, label, rule.severity, rule.effect, tested, rule.reference),
                label,
                values,
            )
            if len(self._facts) > 100_000:
                self._facts.clear()
            self._facts[key] = hit
        return hit

    def rollout_only(self, c: Any, a: ArchInfo, view: tuple[Any, ...], digest: str) -> Decision:
        """Step 5 alone: the kill switch, then the stage ``c`` belongs to with its canary and
        sticky share, with none of the pack's rules (their verdict comes from another pack:
        ``turnout launch`` asks the vLLM release's pack what vLLM can serve, and the service's
        pack what its rollout allows)."""
        _, idx, _ = self.pd.evaluate(c, a, "auto")
        stage = self.pd.stages[idx] if idx >= 0 else None
        included = None
        if stage is not None:
            enabled, pct = view[1 + idx]
            if enabled and pct < 100:
                dep = c.deployment_id
                included = dep is not None and bucket(stage.id, dep) < pct * 100
        return instantiate(self._rollout(_Ctx(a, "auto", stage, digest), view, included), {})

    def select(self, c: Any, a: ArchInfo, pin: str) -> tuple[str | None, list[Message], str | None]:
        """The selection alone, without the chosen runner's validation or the rollout (vLLM's
        ``use_v2_model_runner``, as a pack's early ``evaluate`` steps run it): (runner, the log
        lines, or the error it raises: a pin against a rule that forces V2)."""
        m, _, values = self.pd.evaluate(c, a, pin)
        key = (m, pin, values)
        hit = self._selected.get(key)
        if hit is None:
            runner, lines, error = self._select(m, values, pin)
            hit = (runner, tuple(lines), error)
            if len(self._selected) > 100_000:
                self._selected.clear()
            self._selected[key] = hit
        return hit[0], list(hit[1]), hit[2]

    def _select(
        self, m: int, values: tuple[Any, ...] | None, pin: str
    ) -> tuple[str | None, list[Message], str | None]:
        """:meth:`select` for a rule mask and its matched values (memoised there: the answer
        depends on nothing else)."""
        facts = self._facts_of(m, values) if m else {}
        rules, out = self.pd.rules, []

        def say(tpl: Template | None, rule: int, extra: dict[str, Any] | None = None) -> None:
            if tpl is not None:
                out.append(
                    Message(tpl.level, Text(tpl, tuple((extra or {}).items()), rule).render(facts))
                )

        forced = m & self.m_forces
        if forced:
            for i in bits(forced):
                if pin == "v1" and not rules[i].override_pin:
                    tpl = rules[i].error or self.msgs["v1_blocked"]
                    text = (
                        Text(tpl, (("labels", Labels(1 << i)),), i).render(facts)
                        if tpl is not None
                        else ""
                    )
                    return None, out, text
                if pin == "v1":
                    say(rules[i].message, i)
            return "v2", out, None
        if pin != "auto":
            return pin, out, None
        b1 = m & self.m_blocks_v1
        stays = False
        for i in bits(m & self.m_prefers):
            if b1 and rules[i].yields:
                say(rules[i].skip_message, i, {"v1_labels": Labels(b1)})
            else:
                say(rules[i].message, i)
                stays = True
        if stays:
            return "v1", out, None
        prereq = m & self.m_prereq
        for i in bits(prereq):
            say(rules[i].message, i)
        if prereq:
            return "v1", out, None
        blockers = m & self.m_blockers
        if blockers:
            say(self.msgs["blocked"], -1, {"labels": Labels(blockers)})
            return "v1", out, None
        return "v2", out, None

    # -- resolution (once per shape) ---------------------------------------------------------

    def _plan(
        self,
        a: ArchInfo,
        m: int,
        pin: str,
        idx: int,
        view: tuple[Any, ...],
        included: bool | None,
        digest: str,
        pin_value: str | None = None,
    ) -> Plan:
        x = _Ctx(a, pin, self.pd.stages[idx] if idx >= 0 else None, digest)
        forced = m & self.m_forces
        b1 = m & self.m_blocks_v1
        if forced:
            x.reasons += bits(forced)
            if pin == "v1":
                strict = sum(1 << i for i in bits(forced) if not self.pd.rules[i].override_pin)
                if strict:
                    first = self.pd.rules[bits(strict)[0]]
                    error = (
                        (Text(first.error, (), first.index),)
                        if first.error is not None
                        else self._error(x, "v1_blocked", strict)
                    )
                    return self._done(x, None, "ERROR", error, ErrorCode.PIN_CONFLICT)
                for i in bits(forced):
                    self._emit(x, self.pd.rules[i].message, rule=i)
            return self._pinned_v2(x, m, "STATIC" if pin == "v2" else "TARGETING_MATCH")
        if pin == "v1":
            if b1:
                x.reasons += bits(b1)
                return self._done(
                    x, None, "ERROR", self._error(x, "v1_blocked", b1), ErrorCode.PIN_CONFLICT
                )
            value = self._pin_value("v1", pin_value)
            x.reasons.append(self._pin_reason("v1", value))
            self._emit(x, self.msgs["pinned_v1"], values={"name": self.pd.env_var, "value": value})
            return self._done(x, "v1", "STATIC")
        if pin == "v2":
            x.reasons.append(self._pin_reason("v2", self._pin_value("v2", pin_value)))
            return self._pinned_v2(x, m, "STATIC")
        return self._auto(x, m, b1, view, included)

    @staticmethod
    def _emit(
        x: _Ctx, tpl: Template | None, rule: int = -1, values: dict[str, Any] | None = None
    ) -> None:
        if tpl is not None:
            x.messages.append(Text(tpl, tuple((values or {}).items()), rule))

    def _error(self, x: _Ctx, message: str, mask: int) -> tuple[Text, ...]:
        tpl = self.msgs[message]
        return (Text(tpl, (("labels", Labels(mask)),)),) if tpl is not None else ()

    def _done(
        self,
        x: _Ctx,
        runner: str | None,
        code: str,
        error: tuple[Text, ...] | None = None,
        error_code: ErrorCode | None = None,
        canary: CanaryOutcome | None = None,
    ) -> Plan:
        if runner == "v2":
            self._emit(x, self.msgs["using_v2"])
        return Plan(
            runner,
            "auto" if x.p == "auto" else "pinned",
            x.a.family,
            x.stage.id if x.stage else None,
            canary,
            tuple(x.reasons),
            tuple(x.messages),
            code,
            error,
            x.digest,
            error_code,
            self.pd.name,
        )

    @staticmethod
    def _pin_value(runner: str, raw: str | None) -> str:
        """The runner variable's value as the deployment set it (``"1"``/``"0"`` when the
        caller gave none, as the matrix's pinned cells do)."""
        return raw if raw is not None else ("1" if runner == "v2" else "0")

    def _pin_reason(self, runner: str, value: str) -> Reason:
        return Reason(
            f"pin.{runner}",
            f"pinned to {runner.upper()} by {self.pd.env_var}={value}",
            "hard",
            f"pins_{runner}",
            {self.pd.env_var: value},
            "",
        )

    def _pinned_v2(self, x: _Ctx, m: int, code: str) -> Plan:
        """V2 chosen: its validation (vLLM's _validate_v2_model_runner). A prerequisite with an
        error text fails alone, before any blocker is listed; one without (vLLM 0.33's Triton)
        does not fail a pin."""
        hard = m & self.m_hard
        for i in bits(hard & self.m_prereq):
            tpl = self.pd.rules[i].error
            if tpl is not None:
                x.reasons.append(i)
                return self._done(x, None, "ERROR", (Text(tpl, (), i),), ErrorCode.PIN_CONFLICT)
        blockers = hard & ~self.m_prereq
        if not blockers:
            return self._done(x, "v2", code)
        x.reasons += bits(blockers)
        return self._done(
            x, None, "ERROR", self._error(x, "pinned_blocked", blockers), ErrorCode.PIN_CONFLICT
        )

    def _fallback_v1(self, x: _Ctx, b1: int) -> Plan:
        if not b1:
            return self._done(x, "v1", "TARGETING_MATCH")
        x.reasons += bits(b1)
        return self._done(x, None, "ERROR", self._error(x, "v1_blocked", b1), ErrorCode.NO_RUNNER)

    def _auto(self, x: _Ctx, m: int, b1: int, view: tuple[Any, ...], included: bool | None) -> Plan:
        prefers = m & self.m_prefers
        if prefers:  # a platform default first (vLLM 0.29-0.31 check ROCm before Triton)
            stays = False
            for i in bits(prefers):
                rule = self.pd.rules[i]
                if b1 and rule.yields:
                    self._emit(x, rule.skip_message, rule=i, values={"v1_labels": Labels(b1)})
                else:
                    x.reasons.append(i)
                    self._emit(x, rule.message, rule=i)
                    stays = True
            if stays:
                return self._fallback_v1(x, b1)
        prereq = m & self.m_prereq
        if prereq:
            for i in bits(prereq):
                x.reasons.append(i)
                self._emit(x, self.pd.rules[i].message, rule=i)
            return self._fallback_v1(x, b1)
        blockers = m & self.m_blockers
        if blockers:
            x.reasons += bits(blockers)
            self._emit(x, self.msgs["blocked"], values={"labels": Labels(blockers)})
            return self._fallback_v1(x, b1)
        if b1:
            x.reasons += bits(b1)
            return self._done(x, "v2", "TARGETING_MATCH")
        return self._rollout(x, view, included)

    def _rollout(self, x: _Ctx, view: tuple[Any, ...], included: bool | None) -> Plan:
        a, stage = x.a, x.stage
        fam = {"family": a.family, "family_label": a.family_label}
        if view[0]:
            x.reasons.append(
                Reason(
                    KILL_SWITCH_ID,
                    "the rollout kill switch is on",
                    "soft",
                    "rollout",
                    {},
                    _ROLLOUT_REF,
                )
            )
            self._emit(x, self.msgs["kill_switch"])
            return self._done(x, "v1", "DISABLED")
        if stage is None:
            runner = self.pd.default_runner
            if runner == "v1":
                x.reasons.append(
                    Reason(
                        NO_STAGE_ID,
                        "in no rollout stage",
                        "soft",
                        "rollout",
                        {"family": a.family},
                        _ROLLOUT_REF,
                    )
                )
                self._emit(x, self.msgs["no_stage"], values={"runner": runner.upper(), **fam})
            return self._done(x, runner, "DEFAULT")
        enabled, pct = view[1 + stage.index]
        canary = CanaryOutcome(stage.id, enabled, pct, bool(enabled and (pct >= 100 or included)))
        names: dict[str, Any] = {
            "stage": stage.id,
            "stage_label": stage.label,
            "percentage": pct,
            **fam,
        }
        if not enabled:
            x.reasons.append(
                Reason(
                    STAGE_OFF_ID,
                    f"not yet enabled for V2 (stage {stage.label})",
                    "soft",
                    "rollout",
                    {"family": a.family, "stage": stage.id},
                    _ROLLOUT_REF,
                )
            )
            self._emit(x, self.msgs["stage_off"], values=names)
            return self._done(x, "v1", "DISABLED", canary=canary)
        if pct >= 100:
            return self._done(x, "v2", "TARGETING_MATCH", canary=canary)
        if included:
            return self._done(x, "v2", "SPLIT", canary=canary)
        x.reasons.append(
            Reason(
                SPLIT_OUT_ID,
                f"not in the {pct}% share of stage {stage.label} yet",
                "soft",
                "rollout",
                {"family": a.family, "stage": stage.id, "percentage": pct},
                _ROLLOUT_REF,
            )
        )
        self._emit(x, self.msgs["split_out"], values=names)
        return self._done(x, "v1", "SPLIT", canary=canary)


class _Ctx:
    """One resolution in progress: its inputs, and the reasons and messages so far."""

    __slots__ = ("a", "digest", "messages", "p", "reasons", "stage")

    def __init__(self, a: ArchInfo, p: str, stage: CompiledStage | None, digest: str) -> None:
        self.a, self.p, self.stage, self.digest = a, p, stage, digest
        self.messages: list[Text] = []
        self.reasons: list[int | Reason] = []


def default_view(stages: Sequence[CompiledStage], kill_switch: bool) -> tuple[Any, ...]:
    return (kill_switch, *((s.enabled, s.percentage) for s in stages))
