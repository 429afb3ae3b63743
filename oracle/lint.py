"""lint(): schema and reference errors, then static analysis of a pack.

Findings, each at the file:line:column of the rule or stage concerned:

- a rule that can never match (a condition no value of its closed domain satisfies, or a
  family/architecture condition no architecture of families.yaml meets) - error;
- two rules with the same effect whose conditions match the same deployments - error
  (duplicate); one whose matches are all covered by another's - warning (shadowed: its label
  still appears, it never changes a runner);
- a stage no deployment can reach (its conditions are unsatisfiable or earlier stages catch
  all of its deployments) - error; a family listed by two stages - warning (ambiguous: the
  later listing only applies where the earlier stage's conditions fail);
- a family that is in no stage - warning (its deployments get the pack's default runner);
- an architecture a runner's manifest serves (``pack.manifests``) that families.yaml lacks -
  error; one served for a runner kind other than families.yaml gives it - warning.

Coverage is exact over the closed domains: numeric dimensions are compared on their
representative values, which is what the domains declare.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from turnout.oracle.compile_types import ArchInfo, CompiledRule, CompiledStage
from turnout.oracle.conditions import Condition, nullable
from turnout.oracle.errors import Issue, PackError
from turnout.oracle.fields import FAMILY_ATTRIBUTES
from turnout.oracle.pack import Pack, load_pack
from turnout.oracle.yamlpos import load_with_positions

_ARCH_DIMS = ("family", "architecture")
# Derived dimensions that are a function of one source dimension. A rule's allowed values of
# the derived dimension are folded into the source, so that a contradiction ({quantized: true,
# quantization: none}) never matches and equal spellings ({quantized: false} and
# {quantization: none}) are seen as duplicates.
_DERIVED_FROM: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "quantized": ("quantization", lambda v: v != "none"),
    "pooling": ("runner_kind", lambda v: v == "pooling"),
}


def _value(dim: str, *, arch: ArchInfo, cfg: dict[str, Any]) -> Any:
    if dim in cfg:
        return cfg[dim]
    if dim == "pooling":
        return arch.runner_kind == "pooling"
    return getattr(arch, dim)


def _allowed(cond: Condition | None, domain: Sequence[Any]) -> frozenset[Any]:
    return frozenset(v for v in domain if cond is None or cond.test(v))


class _Linter:
    def __init__(self, pack: Pack) -> None:
        self.pack = pack
        self.data = pack.data
        self.issues: list[Issue] = []
        folder = pack.path
        _, self.cm_pos = load_with_positions(folder / "capability_matrix.yaml")
        _, self.ro_pos = load_with_positions(folder / "rollout.yaml")

    def _rule_issue(self, rule: CompiledRule, message: str, severity: str) -> None:
        file, line, col = rule.origin
        self.issues.append(Issue(file, line, col, message, severity))

    def _stage_issue(self, stage: CompiledStage, message: str, severity: str, *path: Any) -> None:
        self.issues.append(
            self.ro_pos.issue(
                ("stages", stage.index, *(path or ("id",))), message, severity=severity
            )
        )

    def _domain(self, dim: str) -> tuple[Any, ...]:
        if dim in self.data.derived_conditions:
            return (False, True)
        domain = tuple(self.data.domains.get(dim) or ())
        # a field that may be unset has "unset" among its values (vllm-0.33's
        # draft_lm_head_quantization: [fp8, nvfp4] does not cover every deployment)
        return (None, *domain) if domain and nullable(dim) and None not in domain else domain

    def _archs_matching(self, conds: Sequence[Condition]) -> list[ArchInfo]:
        by_dim = {c.dim: c for c in conds}
        return [
            a
            for a in self.data.archs.values()
            if all(by_dim[d].test(getattr(a, d)) for d in _ARCH_DIMS if d in by_dim)
        ]

    def never_matching(self) -> None:
        for rule in self.data.rules:
            sets = self._match_set(rule)
            empty = [
                c.dim
                for c in rule.conditions
                if c.dim not in _ARCH_DIMS
                and not sets.get(_DERIVED_FROM.get(c.dim, (c.dim,))[0], sets.get(c.dim))
            ]
            if empty:
                self._rule_issue(
                    rule,
                    f"rule {rule.id!r} can never match: no value of "
                    f"{', '.join(empty)} satisfies its condition",
                    "error",
                )
            elif not self._archs_matching(rule.conditions):
                self._rule_issue(
                    rule,
                    f"rule {rule.id!r} can never match: no architecture "
                    "meets its family/architecture conditions",
                    "error",
                )

    def _match_set(self, rule: CompiledRule) -> dict[str, frozenset[Any]]:
        """Allowed values per dimension; a derived dimension folded into its source when the
        source's domain is known."""
        sets = {c.dim: _allowed(c, self._domain(c.dim)) for c in rule.conditions}
        for derived, (source, fn) in _DERIVED_FROM.items():
            source_domain = self._domain(source)
            if derived in sets and source_domain:
                wanted = sets.pop(derived)
                allowed = sets.get(source, frozenset(source_domain))
                sets[source] = frozenset(v for v in allowed if fn(v) in wanted)
        return sets

    def _covers(self, outer: dict[str, frozenset[Any]], inner: dict[str, frozenset[Any]]) -> bool:
        """Every deployment ``inner`` matches, ``outer`` matches too."""
        for dim, allowed in outer.items():
            full = frozenset(self._domain(dim))
            if allowed >= full:
                continue
            if dim not in inner or not inner[dim] <= allowed:
                return False
        return True

    def overlapping_rules(self) -> None:
        rules = self.data.rules
        sets = {r.index: self._match_set(r) for r in rules}
        for a, b in itertools.combinations(rules, 2):
            if (a.effect, a.severity, a.prerequisite) != (b.effect, b.severity, b.prerequisite):
                continue
            a_in_b, b_in_a = (
                self._covers(sets[b.index], sets[a.index]),
                self._covers(sets[a.index], sets[b.index]),
            )
            if a_in_b and b_in_a:
                self._rule_issue(
                    b,
                    f"rule {b.id!r} duplicates {a.id!r}: both match the same "
                    "deployments with the same effect",
                    "error",
                )
            elif a_in_b:
                self._rule_issue(
                    a,
                    f"rule {a.id!r} is shadowed by {b.id!r}: every deployment "
                    f"it matches, {b.id!r} matches with the same effect",
                    "warning",
                )
            elif b_in_a:
                self._rule_issue(
                    b,
                    f"rule {b.id!r} is shadowed by {a.id!r}: every deployment "
                    f"it matches, {a.id!r} matches with the same effect",
                    "warning",
                )

    def stages(self) -> None:
        stages = self.data.stages
        if not stages:
            return
        # Model attributes take the architecture's own value (a config could override them,
        # but a family's deployments normally do not); deployment options take every value.
        dims = sorted(
            {c.dim for s in stages for c in s.conditions}
            - set(_ARCH_DIMS)
            - set(FAMILY_ATTRIBUTES)
            - {"pooling"}
        )
        reached: dict[int, set[str]] = {s.index: set() for s in stages}
        stageless: dict[str, dict[str, Any]] = {}
        for arch in self.data.archs.values():
            for values in itertools.product(*(self._domain(d) for d in dims)):
                cfg = dict(zip(dims, values, strict=True))
                idx = self._first_stage(stages, arch, cfg)
                if idx >= 0:
                    reached[idx].add(arch.family)
                else:
                    stageless.setdefault(arch.family, cfg)
        for st in stages:
            if not reached[st.index]:
                self._stage_issue(
                    st,
                    f"stage {st.id!r} can never be reached: its conditions "
                    "are unsatisfiable or earlier stages catch all of its "
                    "deployments",
                    "error",
                )
        self._families_in_two_stages(stages)
        runner = self.data.default_runner.upper()
        for fam, cfg in sorted(stageless.items()):
            example = ", ".join(f"{k}={v}" for k, v in cfg.items()) or "all of them"
            self.issues.append(
                Issue(
                    str(self.pack.path / "rollout.yaml"),
                    1,
                    1,
                    f"family {fam!r} has deployments in no stage ({example}); "
                    f"they get {runner}, the default runner",
                    "warning",
                )
            )

    @staticmethod
    def _first_stage(stages: Sequence[CompiledStage], arch: ArchInfo, cfg: dict[str, Any]) -> int:
        for st in stages:
            if st.families and arch.family not in st.families:
                continue
            read = partial(_value, arch=arch, cfg=cfg)
            if all(c.test(read(c.dim), read) for c in st.conditions):
                return st.index
        return -1

    def _families_in_two_stages(self, stages: Sequence[CompiledStage]) -> None:
        first: dict[str, CompiledStage] = {}
        for st in stages:
            for fam in sorted(st.families):
                if fam in first:
                    self._stage_issue(
                        st,
                        f"family {fam!r} is listed by stages "
                        f"{first[fam].id!r} and {st.id!r}: ambiguous, the first "
                        "matching stage wins",
                        "warning",
                        "families",
                    )
                else:
                    first[fam] = st

    def manifests(self) -> None:
        """Every architecture a runner's manifest serves is one the pack can decide:
        families.yaml lists it, with the runner kind the manifest serves it for."""
        served, manifests = self.data.served, self.data.manifests
        if served is None or manifests is None or self.data.manifests_file is None:
            return
        _, pos = load_with_positions(self.pack.path / self.data.manifests_file.partition("/")[2])
        for runner, m in sorted(manifests.items()):
            for kind, archs in sorted(m.architectures.items()):
                for i, arch in enumerate(archs):
                    at = ("runners", runner, "architectures", kind, i)
                    info = self.data.archs.get(arch)
                    if info is None:
                        self.issues.append(
                            pos.issue(
                                at,
                                f"architecture {arch!r} is served by "
                                f"runner {runner} but not in families.yaml: "
                                "its deployments get unknown_architecture",
                            )
                        )
                    elif info.runner_kind != kind and arch not in served.get(info.runner_kind, ()):
                        self.issues.append(
                            pos.issue(
                                at,
                                f"architecture {arch!r} is served for "
                                f"{kind} only, but families.yaml gives it "
                                f"runner_kind {info.runner_kind}",
                                severity="warning",
                            )
                        )


def lint_pack(name_or_path: str | Path) -> list[Issue]:
    """Every finding for the pack (schema errors first); empty when the pack is clean."""
    try:
        pack = load_pack(name_or_path)
    except PackError as exc:
        return list(exc.issues)
    linter = _Linter(pack)
    linter.never_matching()
    linter.overlapping_rules()
    linter.stages()
    linter.manifests()
    return list(pack.data.warnings) + linter.issues
