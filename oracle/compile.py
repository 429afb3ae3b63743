"""Load, check and compile a policy pack (the three YAML files of one folder, and the runners'
manifests when ``pack.manifests`` names them) once.

The result, :class:`PackData`, holds the checked rules and stages, the architecture table
(families.yaml resolved per architecture) and one generated Python function,
``evaluate(c, a, p)``: the bitmask of rules whose ``when`` holds, the index of the first rollout
stage the deployment belongs to (-1: none) and the matched rules' values (oracle.codegen).
Generating straight-line code from closed domains is what makes a cold decision cost
microseconds (docs/architecture.md §3.5).
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnout.oracle.codegen import generate
from turnout.oracle.compile_types import (
    ArchInfo,
    CompiledRule,
    CompiledStage,
    CompiledStep,
    PackData,
    Template,
)
from turnout.oracle.conditions import (
    NOT_DIMENSIONS,
    Condition,
    ConditionParser,
    OpenDomain,
    arithmetic_names,
    dimension_kind,
    known_dimension_names,
    nullable,
)
from turnout.oracle.config import FIELD_INFO, coerce_field
from turnout.oracle.errors import ConfigError, Issue, PackError
from turnout.oracle.family_table import build_arch_table
from turnout.oracle.fields import RUNNER_PINS
from turnout.oracle.pack_merge import (
    Located,
    MergedMatrix,
    load_matrix_chain,
    merged_messages,
    merged_meta,
)
from turnout.oracle.schema import (
    Families,
    ManifestsFile,
    MessageSpec,
    PackMeta,
    Rollout,
    Rule,
    RunnerManifestSpec,
    Step,
)
from turnout.oracle.stepgen import generate_steps
from turnout.oracle.validate import validate_model
from turnout.oracle.yamlpos import Positions, load_with_positions

PACK_FILES = ("capability_matrix.yaml", "families.yaml", "rollout.yaml")


def _template(raw: Any, default_level: str = "WARNING") -> Template | None:
    if raw is None:
        return None
    if isinstance(raw, MessageSpec):
        return Template(raw.level, raw.text)
    return Template(default_level, str(raw))


_TEXT_REF = re.compile(r"\{texts\.([a-z0-9][a-z0-9_.\-]*)\}")


def _placeholders(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f]


class _Compiler:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.issues: list[Issue] = []
        self.data: dict[str, Any] = {}
        self.pos: dict[str, Positions] = {}
        self.included: list[Path] = []
        self.derived_names: frozenset[str] = frozenset()
        self._parsers: dict[tuple[int, bool], ConditionParser] = {}

    def load(self) -> MergedMatrix:
        for name in PACK_FILES[1:]:
            path = self.folder / name
            if not path.is_file():
                self.issues.append(Issue(str(path), 1, 1, "missing pack file"))
                continue
            try:
                self.data[name], self.pos[name] = load_with_positions(path)
            except PackError as exc:
                self.issues += exc.issues
        merged = load_matrix_chain(self.folder, self.issues)
        self._raise()
        assert merged is not None
        self.included += merged.files[:-1]
        return merged

    def _raise(self) -> None:
        errors = [i for i in self.issues if i.severity == "error"]
        if errors:
            raise PackError(errors)

    def _validate(self, cls: Any, name: str) -> Any:
        try:
            return validate_model(cls, self.data[name], self.pos[name])
        except PackError as exc:
            self.issues += exc.issues
            return None

    def check_template(
        self, text: str, allowed: set[str], pos: Positions, path: tuple[Any, ...]
    ) -> None:
        for ph in _placeholders(text):
            if ph not in allowed and not set(arithmetic_names(ph)) <= allowed:
                self.issues.append(
                    pos.issue(
                        path,
                        f"unknown placeholder {{{ph}}}; expected "
                        "one of: " + ", ".join(sorted(allowed)),
                    )
                )

    def families(
        self, families: Families
    ) -> tuple[dict[str, ArchInfo], dict[str, ArchInfo], dict[str, str]]:
        pos = self.pos["families.yaml"]
        archs, defaults, labels = build_arch_table(families, pos, self.issues)
        if families.families_from is None:
            return archs, defaults, labels
        path = (self.folder / families.families_from).resolve()
        try:
            data, inc_pos = load_with_positions(path)
            base = validate_model(Families, data, inc_pos)
        except PackError as exc:
            self.issues += exc.issues
            return archs, defaults, labels
        if base.families_from is not None:
            self.issues.append(inc_pos.issue(("families_from",), "families_from may not be nested"))
        self.included.append(path)
        b_archs, b_defaults, b_labels = build_arch_table(base, inc_pos, self.issues)
        merged = {k: v for k, v in b_archs.items() if v.family not in defaults} | archs
        return merged, b_defaults | defaults, b_labels | labels

    def domains(
        self, matrix: MergedMatrix, archs: Mapping[str, ArchInfo], families: Mapping[str, str]
    ) -> dict[str, tuple[Any, ...] | None]:
        out: dict[str, tuple[Any, ...] | None] = {}
        for dim, located in matrix.dimensions.items():
            spec, pos, path = located.item, located.pos, located.path
            kind = dimension_kind(dim)
            if kind is None:
                self.issues.append(
                    pos.issue(
                        path,
                        f"unknown dimension {dim!r}; expected one "
                        "of: " + ", ".join(known_dimension_names()),
                        prefer_key=True,
                    )
                )
                continue
            domain = spec.domain
            if dim == "family":
                out[dim] = tuple(sorted(families))
            elif dim == "architecture":
                out[dim] = tuple(sorted(archs))
            elif dim == "runner_pin":
                out[dim] = RUNNER_PINS
            elif dim == "early_runner":
                out[dim] = ("v1", "v2")
            elif kind == "bool":
                out[dim] = (False, True)
            elif domain is None:
                info = FIELD_INFO.get(dim)
                if info is not None and info.vocab is not None:
                    out[dim] = info.vocab
                elif kind in ("int", "float", "list"):
                    self.issues.append(
                        pos.issue(
                            path,
                            f"{kind} dimension {dim!r} needs a domain (its representative values)",
                        )
                    )
                else:
                    out[dim] = None  # open string domain (model_type, quantization)
            else:
                values = self._check_domain(dim, kind, domain, pos, (*path, "domain"))
                out[dim] = OpenDomain(values) if spec.open and kind == "str" else values
            if spec.open and kind != "str":
                self.issues.append(
                    pos.issue(
                        (*path, "open"), f"open: only a string dimension is open; {dim!r} is {kind}"
                    )
                )
        return out

    def _check_domain(
        self, dim: str, kind: str, domain: list[Any], pos: Positions, path: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        vocab = FIELD_INFO[dim].vocab if dim in FIELD_INFO else None
        values: list[Any] = []
        for i, v in enumerate(domain):
            ok = {
                "int": isinstance(v, int) and not isinstance(v, bool),
                "float": isinstance(v, int | float) and not isinstance(v, bool),
                "list": isinstance(v, list),
                "str": isinstance(v, str),
                "enum": isinstance(v, str),
            }.get(kind, False)
            if not ok:
                self.issues.append(pos.issue((*path, i), f"{dim}: {v!r} is not a {kind} value"))
            elif vocab is not None and v not in vocab:
                self.issues.append(
                    pos.issue(
                        (*path, i),
                        f"unknown value {v!r} for {dim}; expected one of: " + ", ".join(vocab),
                    )
                )
            else:
                values.append(tuple(v) if isinstance(v, list) else v)
        if len(set(values)) != len(values):
            self.issues.append(pos.issue(path, f"{dim}: duplicate values in domain"))
        return tuple(values)

    def parser(
        self, domains: Mapping[str, tuple[Any, ...] | None], pos: Positions, steps: bool = False
    ) -> ConditionParser:
        """One condition parser per file (issues are collected from each at the end)."""
        key = (id(pos), steps)
        if key not in self._parsers:
            self._parsers[key] = ConditionParser(domains, pos, self.derived_names, steps)
        return self._parsers[key]

    def collect_parser_issues(self) -> None:
        for parser in self._parsers.values():
            self.issues += parser.issues
            parser.issues = []

    def derived(
        self, matrix: MergedMatrix, domains: dict[str, tuple[Any, ...] | None]
    ) -> dict[str, tuple[tuple[Condition, ...], ...]]:
        out: dict[str, tuple[tuple[Condition, ...], ...]] = {}
        for name, located in matrix.derived.items():
            if dimension_kind(name) is not None:
                self.issues.append(
                    located.pos.issue(
                        located.path,
                        f"derived {name!r} has the name of a dimension",
                        prefer_key=True,
                    )
                )
                continue
            parser = ConditionParser(domains, located.pos)  # derived may not use derived
            out[name] = tuple(
                parser.parse_when(alt, (*located.path, "any", i))
                for i, alt in enumerate(located.item.any)
            )
            self.issues += parser.issues
        return out

    def steps(
        self, matrix: MergedMatrix, domains: dict[str, tuple[Any, ...] | None]
    ) -> list[tuple[Located[Step], tuple[Condition, ...], dict[str, Any]]]:
        out: list[tuple[Located[Step], tuple[Condition, ...], dict[str, Any]]] = []
        seen: set[str] = set()
        finals = 0
        for located in matrix.steps:
            step, pos, path = located.item, located.pos, located.path
            if step.id in seen:
                self.issues.append(pos.issue((*path, "id"), f"duplicate step id {step.id!r}"))
            seen.add(step.id)
            finals += step.final
            conds = self.parser(domains, pos, steps=True).parse_when(step.when, (*path, "when"))
            sets = self._check_sets(step, pos, path)
            if step.refuse is not None:
                text = self.inline_texts(step.refuse, matrix, pos, (*path, "refuse"))
                # a refusal may also quote the model as the command named it (vLLM's own
                # texts print model_config.model)
                allowed = {*known_dimension_names(), "model"}
                self.check_template(text, allowed, pos, (*path, "refuse"))
                located = Located(step.model_copy(update={"refuse": text}), pos, path)
            out.append((located, conds, sets))
        if finals > 1:
            self.issues.append(matrix.meta_pos.issue(("steps",), "only one step may be final"))
        after_final = False
        for located, _, _ in out:
            if located.item.final:
                after_final = True
            elif after_final and located.item.kind != "refuse":
                self.issues.append(
                    located.pos.issue(
                        (*located.path, "id"),
                        "a step after the final one can only refuse: the decision is made by then",
                    )
                )
        return out

    def inline_texts(
        self, text: str, matrix: MergedMatrix, pos: Positions, path: tuple[Any, ...]
    ) -> str:
        """``text`` with each ``{texts.NAME}`` replaced by the pack's text of that name (its
        braces doubled: a text is quoted, never a template); an unknown name is an issue."""

        def quote(match: re.Match[str]) -> str:
            name = match.group(1)
            located = matrix.texts.get(name)
            if located is None:
                self.issues.append(
                    pos.issue(
                        path,
                        f"unknown text {{texts.{name}}}; the pack's texts: "
                        + (", ".join(sorted(matrix.texts)) or "none"),
                    )
                )
                return ""
            return located.item.replace("{", "{{").replace("}", "}}")

        return _TEXT_REF.sub(quote, text)

    def _check_sets(self, step: Step, pos: Positions, path: tuple[Any, ...]) -> dict[str, Any]:
        sets: dict[str, Any] = {}
        for name, value in (step.set or {}).items():
            p = (*path, "set", name)
            if name not in FIELD_INFO or name in NOT_DIMENSIONS:
                self.issues.append(
                    pos.issue(p, f"set: {name!r} is not a field a step can change", prefer_key=True)
                )
                continue
            if value is None and not nullable(name):
                self.issues.append(pos.issue(p, f"set: {name} is never null"))
                continue
            try:
                sets[name] = None if value is None else coerce_field(name, value)
            except ConfigError as exc:
                self.issues.append(pos.issue(p, f"set: {exc.message}"))
        return sets

    def rules(
        self, matrix: MergedMatrix, domains: dict[str, tuple[Any, ...] | None]
    ) -> tuple[CompiledRule, ...]:
        dims_allowed = set(known_dimension_names(self.derived_names))
        seen: dict[str, int] = {}
        out: list[CompiledRule] = []
        for i, located in enumerate(matrix.rules):
            rule, pos, path = located.item, located.pos, located.path
            parser = self.parser(domains, pos)
            if rule.id in seen:
                self.issues.append(
                    pos.issue(
                        (*path, "id"),
                        f"duplicate rule id {rule.id!r} (first is rules[{seen[rule.id]}])",
                    )
                )
                continue
            seen[rule.id] = i
            conditions = parser.parse_when(rule.when, (*path, "when"))
            texts = {
                "label": rule.label,
                "message": rule.message,
                "error": rule.error,
                "skip_message": rule.skip_message,
            }
            mentioned: list[str] = []
            for key, raw in texts.items():
                text = raw.text if isinstance(raw, MessageSpec) else raw
                if text is None:
                    continue
                extra = {"v1_labels"} if key == "skip_message" else set()
                self.check_template(text, dims_allowed | extra, pos, (*path, key))
                mentioned += [p for p in _placeholders(text) if p in dims_allowed]
            self._check_rule_messages(rule, pos, path)
            tested = [d for c in conditions for d in (c.dim, *c.refs)]
            mentioned = [m for m in mentioned if m not in ("v1_labels", "early_runner")]
            dims = tuple(dict.fromkeys(tested + mentioned))
            out.append(
                CompiledRule(
                    index=len(out),
                    id=rule.id,
                    label=Template("WARNING", rule.label),
                    effect=rule.effect,
                    runner=rule.blocks or rule.forces or rule.prefers or "",
                    severity=rule.severity,
                    prerequisite=rule.prerequisite,
                    override_pin=rule.override_pin,
                    conditions=conditions,
                    dims=dims,
                    message=_template(rule.message),
                    error=_template(rule.error),
                    skip_message=_template(rule.skip_message),
                    reason=rule.reason,
                    reference=rule.reference,
                    origin=(pos.file, *pos.at((*path, "id"))),
                    yields=rule.yields,
                )
            )
        self.collect_parser_issues()
        return tuple(out)

    def _check_rule_messages(self, rule: Rule, pos: Positions, path: tuple[Any, ...]) -> None:
        wanted = {
            "message": rule.prerequisite or rule.prefers is not None or rule.override_pin,
            "error": rule.prerequisite or rule.forces is not None,
            "skip_message": rule.prefers is not None and rule.yields,
        }
        for key, allowed in wanted.items():
            if getattr(rule, key) is not None and not allowed:
                self.issues.append(
                    pos.issue(
                        (*path, key),
                        f"{key} is not used by a rule with "
                        f"{rule.effect}" + (" (not a prerequisite)" if rule.blocks else ""),
                    )
                )
        if rule.prerequisite and rule.message is None:
            self.issues.append(
                pos.issue(
                    path, "a prerequisite needs a message (auto); its error (pinned) is optional"
                )
            )

    def stages(
        self,
        rollout: Rollout,
        domains: dict[str, tuple[Any, ...] | None],
        families: Mapping[str, str],
    ) -> tuple[CompiledStage, ...]:
        pos = self.pos["rollout.yaml"]
        parser = ConditionParser(domains, pos, self.derived_names)
        seen: set[str] = set()
        out: list[CompiledStage] = []
        for i, st in enumerate(rollout.stages):
            path: tuple[Any, ...] = ("stages", i)
            if st.id in seen:
                self.issues.append(pos.issue((*path, "id"), f"duplicate stage id {st.id!r}"))
            seen.add(st.id)
            for j, fam in enumerate(st.families):
                if fam not in families:
                    self.issues.append(
                        pos.issue(
                            (*path, "families", j),
                            f"unknown family {fam!r}; families.yaml has no such family",
                        )
                    )
            conds = parser.parse_when(st.when, (*path, "when"))
            out.append(
                CompiledStage(
                    i,
                    st.id,
                    st.label,
                    frozenset(st.families),
                    conds,
                    st.enabled,
                    st.percentage,
                    st.description,
                    dict(st.when),
                )
            )
        self.issues += parser.issues
        return tuple(out)

    def manifests(self, meta: PackMeta) -> dict[str, RunnerManifestSpec] | None:
        """The runners' manifests the pack names (``pack.manifests``), or None."""
        name = meta.manifests
        if name is None:
            return None
        path = self.folder / name
        try:
            data, pos = load_with_positions(path)
            file: ManifestsFile = validate_model(ManifestsFile, data, pos)
        except PackError as exc:
            self.issues += exc.issues
            return None
        self.included.append(path)
        return {str(name): spec for name, spec in file.runners.items()}

    def messages(self, matrix: MergedMatrix) -> dict[str, Template | None]:
        messages = merged_messages(matrix)
        allowed = {
            "blocked": {"labels"},
            "pinned_blocked": {"labels"},
            "v1_blocked": {"labels"},
            "stage_off": {"family", "family_label", "stage", "stage_label"},
            "split_out": {"family", "family_label", "stage", "stage_label", "percentage"},
            "no_stage": {"family", "family_label", "runner"},
            "invalid_env": {"name", "value"},
            "pinned_v1": {"name", "value"},
        }
        out: dict[str, Template | None] = {}
        for key in type(messages).model_fields:
            raw = getattr(messages, key)
            level = "INFO" if key in ("using_v2", "pinned_v1") else "WARNING"
            tpl = _template(raw, level)
            loc = matrix.message_pos.get(key)
            if tpl is not None and loc is not None:
                self.check_template(tpl.text, allowed.get(key, set()), loc.pos, loc.path)
            out[key] = tpl
        return out


def _digest(folder: Path, extra: list[Path]) -> str:
    h = hashlib.sha256()
    for path in [folder / name for name in PACK_FILES] + extra:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _compiled_steps(
    steps: list[tuple[Located[Step], tuple[Condition, ...], dict[str, Any]]],
    tests: tuple[Any, ...],
    issues: list[Issue],
) -> tuple[CompiledStep, ...]:
    index = {loc.item.id: i for i, (loc, _, _) in enumerate(steps)}
    out = []
    for i, (loc, conds, sets) in enumerate(steps):
        unless = set()
        for j, sid in enumerate(loc.item.unless):
            if index.get(sid, i) >= i:
                issues.append(
                    loc.pos.issue(
                        (*loc.path, "unless", j), f"unless: {sid!r} is not an earlier step"
                    )
                )
            else:
                unless.add(index[sid])
        refusal = _template(loc.item.refuse)
        out.append(
            CompiledStep(
                i,
                loc.item.id,
                loc.item.kind,
                conds,
                sets,
                refusal,
                loc.item.reference,
                tests[i],
                frozenset(unless),
                tuple(_placeholders(refusal.text)) if refusal is not None else (),
                tuple(dict.fromkeys(d for c in conds for d in (c.dim, *c.refs))),
            )
        )
    return tuple(out)


def compile_pack(folder: Path) -> PackData:
    """Load and compile the pack in ``folder``; raises PackError listing every problem."""
    comp = _Compiler(folder)
    matrix = comp.load()
    families = comp._validate(Families, "families.yaml")
    rollout = comp._validate(Rollout, "rollout.yaml")
    meta = merged_meta(matrix, comp.issues)
    comp._raise()
    archs, family_defaults, labels = comp.families(families)
    domains = comp.domains(matrix, archs, labels)
    derived = comp.derived(matrix, domains)
    comp.derived_names = frozenset(derived)
    steps = comp.steps(matrix, domains)
    rules = comp.rules(matrix, domains)
    stages = comp.stages(rollout, domains, labels)
    messages = comp.messages(matrix)
    comp.collect_parser_issues()
    comp._raise()
    gen = generate(rules, stages, derived, [conds for _, conds, _ in steps])
    compiled_steps = _compiled_steps(steps, gen.step_tests, comp.issues)
    program = (
        generate_steps(compiled_steps, frozenset(derived), gen.namespace, gen.source)
        if compiled_steps
        else None
    )
    manifests = comp.manifests(meta)
    comp._raise()
    return PackData(
        name=meta.name,
        path=folder,
        description=meta.description,
        env_var=meta.env_var or "",
        env_parse=meta.env_parse or "strict",
        reference=meta.reference,
        messages=messages,
        domains=domains,
        rules=rules,
        stages=stages,
        archs=archs,
        family_labels=labels,
        family_defaults=family_defaults,
        kill_switch=rollout.kill_switch,
        default_runner=rollout.default_runner,
        digest=_digest(folder, comp.included),
        evaluate=gen.evaluate,
        getters=gen.getters,
        source=gen.source,
        warnings=[i for i in comp.issues if i.severity == "warning"],
        steps=compiled_steps,
        log_once=bool(meta.log_once),
        unknown_fields=tuple(meta.unknown_fields or ()),
        release=meta.release,
        derived=gen.derived,
        derived_conditions=derived,
        step_program=program,
        manifests=manifests,
        served=_served(manifests),
        manifests_file=f"{folder.name}/{meta.manifests}" if manifests is not None else None,
    )


def _served(manifests: Mapping[str, RunnerManifestSpec] | None) -> dict[str, frozenset[str]] | None:
    """Runner kind -> the architectures at least one runner's manifest serves."""
    if manifests is None:
        return None
    kinds: dict[str, set[str]] = {}
    for m in manifests.values():
        for kind, archs in m.architectures.items():
            kinds.setdefault(kind, set()).update(archs)
    return {kind: frozenset(archs) for kind, archs in kinds.items()}
