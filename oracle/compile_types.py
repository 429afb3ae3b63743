"""The compiled form of a policy pack: what :mod:`oracle.compile` produces and
:mod:`oracle.policy` evaluates."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnout.oracle.conditions import Condition
from turnout.oracle.errors import Issue


@dataclass(frozen=True, slots=True)
class ArchInfo:
    """One architecture's family and resolved attributes (families.yaml)."""

    architecture: str
    family: str
    family_label: str
    is_moe: bool
    use_mla: bool
    has_inner_state: bool
    is_hybrid: bool
    attention_free: bool
    is_multimodal: bool
    is_encoder_decoder: bool
    is_diffusion: bool
    runner_kind: str
    has_index_topk: bool = False
    supports_mamba_prefix_caching: bool = False


@dataclass(frozen=True, slots=True)
class Template:
    """A message template and its level."""

    level: str
    text: str

    def render(self, values: Mapping[str, Any]) -> str:
        """The text with its placeholders filled (checked against ``values`` at load)."""
        return self.text.format_map(values)


@dataclass(frozen=True)
class CompiledRule:
    index: int
    id: str
    label: Template
    effect: str  # blocks_v1 | blocks_v2 | forces_v1 | forces_v2 | prefers_v1 | prefers_v2
    runner: str
    severity: str
    prerequisite: bool
    override_pin: bool
    conditions: tuple[Condition, ...]
    dims: tuple[str, ...]  # tested dimensions, then those only the label/messages mention
    message: Template | None
    error: Template | None
    skip_message: Template | None
    reason: str
    reference: str
    origin: tuple[str, int, int] = ("", 1, 1)  # file, line, column of the rule's id
    yields: bool = True  # prefers: gives way when V1 cannot serve the config


@dataclass(frozen=True)
class CompiledStage:
    index: int
    id: str
    label: str
    families: frozenset[str]
    conditions: tuple[Condition, ...]
    enabled: bool
    percentage: int
    description: str
    when: Mapping[str, Any]


@dataclass(frozen=True)
class CompiledStep:
    """One step of a pack's ``steps`` (oracle.steps runs them): ``kind`` is set | refuse |
    evaluate | final; ``test(c, a, p, e)`` its condition over the config, the architecture's
    attributes, the runner pin and the last early runner."""

    index: int
    id: str
    kind: str
    conditions: tuple[Condition, ...]
    sets: Mapping[str, Any]
    error: Template | None
    reference: str
    test: Callable[[Any, ArchInfo, str, str | None], bool]
    unless: frozenset[int] = frozenset()
    #: the refusal text's placeholders (``tp``, ``tp*pcp``, ``tp//kv``), and the dimensions
    #: its conditions read (the reason's matched values): both known once the pack compiles
    placeholders: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()


@dataclass
class PackData:
    name: str
    path: Path
    description: str
    env_var: str
    env_parse: str
    reference: str
    messages: dict[str, Template | None]
    domains: dict[str, tuple[Any, ...] | None]
    rules: tuple[CompiledRule, ...]
    stages: tuple[CompiledStage, ...]
    archs: dict[str, ArchInfo]
    family_labels: dict[str, str]
    family_defaults: dict[str, ArchInfo]  # a family's own attributes (config family override)
    kill_switch: bool
    default_runner: str
    digest: str
    # (config, attributes, pin) -> (rule mask, stage index or -1, matched rules' values)
    evaluate: Callable[[Any, ArchInfo, str], tuple[int, int, tuple[Any, ...] | None]]
    getters: dict[str, Callable[[Any, ArchInfo, str], Any]]
    source: str = ""
    warnings: list[Issue] = field(default_factory=list)
    steps: tuple[CompiledStep, ...] = ()
    log_once: bool = False
    unknown_fields: tuple[str, ...] = ()
    release: str = ""
    derived: Mapping[str, Callable[[Any, ArchInfo, str], Any]] = field(default_factory=dict)
    # derived predicate -> its alternatives (each ANDs its conditions), for interpreters
    derived_conditions: Mapping[str, tuple[tuple[Condition, ...], ...]] = field(
        default_factory=dict
    )
    step_program: Any = None  # oracle.stepgen.StepProgram of ``steps`` (None without steps)
    # runner -> its manifest (``pack.manifests``), and runner kind -> the architectures some
    # runner serves; None when the pack names no manifests (nothing is refused for them).
    manifests: dict[str, Any] | None = None
    served: dict[str, frozenset[str]] | None = None
    manifests_file: str | None = None  # e.g. "turnout/manifests.json", the reasons' reference
