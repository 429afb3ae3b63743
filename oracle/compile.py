"""Load, check and compile a policy pack (the three YAML files of one folder, and the runners'
manifests when ``pack.manifests`` names them) once.

The result, :class:`PackData`, holds the checked rules and stages, the architecture table
(families.yaml resolved per architecture) and one generated Python function,
``evaluate(c, a, p)``: the bitmask of rules whose ``when`` holds, the index of the first rollout
stage the deployment belongs to (-1: none) and the matched rules' values (oracle.codegen).
Generating straight-line code from closed domains is what makes a cold decision cost
microseconds (DESIGN §3.5).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oracle.codegen import generate
from oracle.compile_types import (
    ArchInfo,
    CompiledRule,
    CompiledStage,
    PackData,
    Template,
)
from oracle.conditions import ConditionParser, dimension_kind, known_dimension_names
from oracle.config import FIELD_INFO
from oracle.errors import Issue, PackError
from oracle.family_table import build_arch_table
from oracle.fields import RUNNER_PINS
from oracle.schema import (
    CapabilityMatrix,
    Families,
    ManifestsFile,
    MessageSpec,
    Rollout,
    Rule,
    RunnerManifestSpec,
)
from oracle.validate import validate_model
from oracle.yamlpos import Positions, load_with_positions

PACK_FILES = ("capability_matrix.yaml", "families.yaml", "rollout.yaml")


def _template(raw: Any, default_level: str = "WARNING") -> Template | None:
    if raw is None:
        return None
    if isinstance(raw, MessageSpec):
        return Template(raw.level, raw.text)
    return Template(default_level, str(raw))


def _placeholders(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f]


class _Compiler:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.issues: list[Issue] = []
        self.data: dict[str, Any] = {}
        self.pos: dict[str, Positions] = {}
        self.included: list[Path] = []

    def load(self) -> None:
        for name in PACK_FILES:
            path = self.folder / name
            if not path.is_file():
                self.issues.append(Issue(str(path), 1, 1, "missing pack file"))
                continue
            try:
                self.data[name], self.pos[name] = load_with_positions(path)
            except PackError as exc:
                self.issues += exc.issues
        self._raise()

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

    def check_template(self, text: str, allowed: set[str], pos: Positions,
                       path: tuple[Any, ...]) -> None:
        for ph in _placeholders(text):
            if ph not in allowed:
                self.issues.append(pos.issue(path, f"unknown placeholder {{{ph}}}; expected "
                                                   "one of: " + ", ".join(sorted(allowed))))

    def families(self, families: Families
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
            self.issues.append(inc_pos.issue(("families_from",), "families_from may not be "
                                             "nested"))
        self.included.append(path)
        b_archs, b_defaults, b_labels = build_arch_table(base, inc_pos, self.issues)
        merged = {k: v for k, v in b_archs.items() if v.family not in defaults} | archs
        return merged, b_defaults | defaults, b_labels | labels

    def domains(self, matrix: CapabilityMatrix, archs: Mapping[str, ArchInfo],
                families: Mapping[str, str]) -> dict[str, tuple[Any, ...] | None]:
        pos = self.pos["capability_matrix.yaml"]
        out: dict[str, tuple[Any, ...] | None] = {}
        for dim, spec in matrix.dimensions.items():
            path = ("dimensions", dim)
            kind = dimension_kind(dim)
            if kind is None:
                self.issues.append(pos.issue(path, f"unknown dimension {dim!r}; expected one "
                                             "of: " + ", ".join(known_dimension_names()),
                                             prefer_key=True))
                continue
            domain = spec.domain
            if dim == "family":
                out[dim] = tuple(sorted(families))
            elif dim == "architecture":
                out[dim] = tuple(sorted(archs))
            elif dim == "runner_pin":
                out[dim] = RUNNER_PINS
            elif kind == "bool":
                out[dim] = (False, True)
            elif domain is None:
                info = FIELD_INFO.get(dim)
                if info is not None and info.vocab is not None:
                    out[dim] = info.vocab
                elif kind in ("int", "float", "list"):
                    self.issues.append(pos.issue(path, f"{kind} dimension {dim!r} needs a "
                                                       "domain (its representative values)"))
                else:
                    out[dim] = None  # open string domain (model_type, quantization)
            else:
                out[dim] = self._check_domain(dim, kind, domain, pos, (*path, "domain"))
        return out

    def _check_domain(self, dim: str, kind: str, domain: list[Any], pos: Positions,
                      path: tuple[Any, ...]) -> tuple[Any, ...]:
        vocab = FIELD_INFO[dim].vocab if dim in FIELD_INFO else None
        values: list[Any] = []
        for i, v in enumerate(domain):
            ok = {
                "int": isinstance(v, int) and not isinstance(v, bool),
                "float": isinstance(v, int | float) and not isinstance(v, bool),
                "list": isinstance(v, list),
                "str": isinstance(v, str), "enum": isinstance(v, str),
            }.get(kind, False)
            if not ok:
                self.issues.append(pos.issue((*path, i), f"{dim}: {v!r} is not a {kind} value"))
            elif vocab is not None and v not in vocab:
                self.issues.append(pos.issue((*path, i), f"unknown value {v!r} for {dim}; "
                                             "expected one of: " + ", ".join(vocab)))
            else:
                values.append(tuple(v) if isinstance(v, list) else v)
        if len(set(values)) != len(values):
            self.issues.append(pos.issue(path, f"{dim}: duplicate values in domain"))
        return tuple(values)

    def rules(self, matrix: CapabilityMatrix, domains: dict[str, tuple[Any, ...] | None]
              ) -> tuple[CompiledRule, ...]:
        pos = self.pos["capability_matrix.yaml"]
        parser = ConditionParser(domains, pos)
        dims_allowed = set(known_dimension_names())
        seen: dict[str, int] = {}
        out: list[CompiledRule] = []
        for i, rule in enumerate(matrix.rules):
            path: tuple[Any, ...] = ("rules", i)
            if rule.id in seen:
                self.issues.append(pos.issue((*path, "id"), f"duplicate rule id {rule.id!r} "
                                             f"(first is rules[{seen[rule.id]}])"))
                continue
            seen[rule.id] = i
            conditions = parser.parse_when(rule.when, (*path, "when"))
            texts = {"label": rule.label, "message": rule.message, "error": rule.error,
                     "skip_message": rule.skip_message}
            mentioned: list[str] = []
            for key, raw in texts.items():
                text = raw.text if isinstance(raw, MessageSpec) else raw
                if text is None:
                    continue
                extra = {"v1_labels"} if key == "skip_message" else set()
                self.check_template(text, dims_allowed | extra, pos, (*path, key))
                mentioned += [p for p in _placeholders(text) if p in dims_allowed]
            self._check_rule_messages(rule, pos, path)
            tested = [c.dim for c in conditions]
            dims = tuple(dict.fromkeys(tested + mentioned))
            out.append(CompiledRule(
                index=len(out), id=rule.id, label=Template("WARNING", rule.label),
                effect=rule.effect, runner=rule.blocks or rule.forces or rule.prefers or "",
                severity=rule.severity, prerequisite=rule.prerequisite,
                override_pin=rule.override_pin, conditions=conditions, dims=dims,
                message=_template(rule.message), error=_template(rule.error),
                skip_message=_template(rule.skip_message), reason=rule.reason,
                reference=rule.reference))
        self.issues += parser.issues
        return tuple(out)

    def _check_rule_messages(self, rule: Rule, pos: Positions, path: tuple[Any, ...]) -> None:
        wanted = {"message": rule.prerequisite or rule.prefers is not None or rule.override_pin,
                  "error": rule.prerequisite, "skip_message": rule.prefers is not None}
        for key, allowed in wanted.items():
            if getattr(rule, key) is not None and not allowed:
                self.issues.append(pos.issue((*path, key), f"{key} is not used by a rule with "
                                             f"{rule.effect}" + (" (not a prerequisite)" if
                                                                rule.blocks else "")))
        if rule.prerequisite and (rule.message is None or rule.error is None):
            self.issues.append(pos.issue(path, "a prerequisite needs a message (auto) and an "
                                               "error (pinned)"))

    def stages(self, rollout: Rollout, domains: dict[str, tuple[Any, ...] | None],
               families: Mapping[str, str]) -> tuple[CompiledStage, ...]:
        pos = self.pos["rollout.yaml"]
        parser = ConditionParser(domains, pos)
        seen: set[str] = set()
        out: list[CompiledStage] = []
        for i, st in enumerate(rollout.stages):
            path: tuple[Any, ...] = ("stages", i)
            if st.id in seen:
                self.issues.append(pos.issue((*path, "id"), f"duplicate stage id {st.id!r}"))
            seen.add(st.id)
            for j, fam in enumerate(st.families):
                if fam not in families:
                    self.issues.append(pos.issue((*path, "families", j), f"unknown family "
                                                 f"{fam!r}; families.yaml has no such family"))
            conds = parser.parse_when(st.when, (*path, "when"))
            out.append(CompiledStage(i, st.id, st.label, frozenset(st.families), conds,
                                     st.enabled, st.percentage, st.description, dict(st.when)))
        self.issues += parser.issues
        return tuple(out)

    def manifests(self, matrix: CapabilityMatrix) -> dict[str, RunnerManifestSpec] | None:
        """The runners' manifests the pack names (``pack.manifests``), or None."""
        name = matrix.pack.manifests
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

    def messages(self, matrix: CapabilityMatrix) -> dict[str, Template | None]:
        pos = self.pos["capability_matrix.yaml"]
        allowed = {
            "blocked": {"labels"}, "pinned_blocked": {"labels"}, "v1_blocked": {"labels"},
            "stage_off": {"family", "family_label", "stage", "stage_label"},
            "split_out": {"family", "family_label", "stage", "stage_label", "percentage"},
            "no_stage": {"family", "family_label", "runner"},
            "invalid_env": {"name", "value"}, "pinned_v1": {"name", "value"},
        }
        out: dict[str, Template | None] = {}
        for key in type(matrix.messages).model_fields:
            raw = getattr(matrix.messages, key)
            level = "INFO" if key in ("using_v2", "pinned_v1") else "WARNING"
            tpl = _template(raw, level)
            if tpl is not None:
                self.check_template(tpl.text, allowed.get(key, set()), pos, ("messages", key))
            out[key] = tpl
        return out


def _digest(folder: Path, extra: list[Path]) -> str:
    h = hashlib.sha256()
    for path in [folder / name for name in PACK_FILES] + extra:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def compile_pack(folder: Path) -> PackData:
    """Load and compile the pack in ``folder``; raises PackError listing every problem."""
    comp = _Compiler(folder)
    comp.load()
    matrix = comp._validate(CapabilityMatrix, "capability_matrix.yaml")
    families = comp._validate(Families, "families.yaml")
    rollout = comp._validate(Rollout, "rollout.yaml")
    comp._raise()
    archs, family_defaults, labels = comp.families(families)
    domains = comp.domains(matrix, archs, labels)
    rules = comp.rules(matrix, domains)
    stages = comp.stages(rollout, domains, labels)
    messages = comp.messages(matrix)
    manifests = comp.manifests(matrix)
    comp._raise()
    evaluate, getters, source = generate(rules, stages)
    meta = matrix.pack
    return PackData(
        name=meta.name, path=folder, description=meta.description, env_var=meta.env_var,
        env_parse=meta.env_parse, reference=meta.reference, messages=messages,
        domains=domains, rules=rules, stages=stages, archs=archs, family_labels=labels,
        family_defaults=family_defaults, kill_switch=rollout.kill_switch,
        default_runner=rollout.default_runner, digest=_digest(folder, comp.included),
        evaluate=evaluate, getters=getters, source=source,
        warnings=[i for i in comp.issues if i.severity == "warning"],
        manifests=manifests, served=_served(manifests),
        manifests_file=f"{folder.name}/{meta.manifests}" if manifests is not None else None)


def _served(manifests: Mapping[str, RunnerManifestSpec] | None) -> dict[str, frozenset[str]] | None:
    """Runner kind -> the architectures at least one runner's manifest serves."""
    if manifests is None:
        return None
    kinds: dict[str, set[str]] = {}
    for m in manifests.values():
        for kind, archs in m.architectures.items():
            kinds.setdefault(kind, set()).update(archs)
    return {kind: frozenset(archs) for kind, archs in kinds.items()}
