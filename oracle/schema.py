"""The policy-pack file formats as pydantic models (docs/policy-language.md describes them).

Structure and types are checked here; meaning (dimension names, values in their closed domains,
family and cohort references, template placeholders) is checked by :mod:`oracle.compile`,
which knows the positions of every node. Unknown keys are errors everywhere.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Runner = Literal["v1", "v2"]
Level = Literal["INFO", "WARNING"]
Scalar = str | bool | int | float
Identifier = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$", max_length=80)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class MessageSpec(_Strict):
    """A log line: its level and its text (a template; ``{name}`` placeholders)."""

    level: Level = "WARNING"
    text: str


Message = str | MessageSpec  # a bare string is a WARNING


class PackMeta(_Strict):
    """Who the pack describes and how its runner variable is read.

    ``extends`` names a pack (a shipped name or a path relative to this pack) whose files this
    one starts from: its rules and steps are merged by id (docs/policy-language.md). A pack
    that extends another may leave out everything it inherits.
    """

    name: str
    description: str = ""
    env_var: Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]*$")] | None = None
    # strict: unset -> auto, "0" -> V1, "1" -> V2, anything else an error.
    # int: Python int(value) like vLLM's envs.py (bool(int(v)); "true" is an error, "2" pins V2).
    env_parse: Literal["strict", "int"] | None = None
    reference: str = ""
    extends: str | None = None
    # vLLM's logger.*_once: a log line already given is not given again (early evaluations).
    log_once: bool | None = None
    # Fields the described release does not have: a config that sets one is refused by name.
    unknown_fields: list[str] | None = None
    release: str = ""
    # The runners' capability manifests (a JSON file of this folder, generated from the
    # runners' code): when set, an architecture no runner serves is refused.
    manifests: str | None = None


class Messages(_Strict):
    """The pack's message shapes. ``None`` means "no line" (vLLM logs nothing there)."""

    using_v2: Message | None = MessageSpec(level="INFO", text="Using V2 Model Runner")
    blocked: Message = (
        "Model Runner V2 does not yet support {labels}; using the V1 model runner instead."
    )
    pinned_blocked: str = "Model Runner V2 does not yet support: {labels}"
    v1_blocked: str = "Model Runner V1 does not support: {labels}"
    pinned_v1: Message | None = None
    kill_switch: Message | None = (
        "Model Runner V2 is switched off by the rollout kill switch; "
        "using the V1 model runner instead."
    )
    stage_off: Message | None = MessageSpec(
        level="INFO",
        text="Model Runner V2 is not yet enabled for {family_label} (stage "
        "{stage_label}); using the V1 model runner instead.",
    )
    split_out: Message | None = MessageSpec(
        level="INFO",
        text="Model Runner V2 is enabled for {percentage}% of stage {stage_label} and "
        "this deployment is not in that share yet; using the V1 model "
        "runner instead.",
    )
    no_stage: Message | None = MessageSpec(
        level="INFO", text="{family_label} is in no rollout stage; using the {runner} model runner."
    )
    invalid_env: str = "{name} must be unset, 0 or 1; got '{value}'"


class Dimension(_Strict):
    """A dimension the pack's rules use, with its closed domain (bool dimensions: implicit).
    ``open: true`` makes a string dimension's domain representative values, as numeric ones
    are: a condition may name other values (a draft's architecture: any the registry has)."""

    domain: list[Scalar | list[str]] | None = None
    open: bool = False
    description: str = ""


class Rule(_Strict):
    """One capability rule. Exactly one of ``blocks``, ``forces``, ``prefers``.

    ``after`` / ``before`` (another rule's id) place a rule an extending pack adds or moves; a
    rule whose id the base pack has replaces it in place.
    """

    id: Identifier
    label: str
    blocks: Runner | None = None
    forces: Runner | None = None
    prefers: Runner | None = None
    severity: Literal["hard", "soft"] = "hard"
    prerequisite: bool = False
    override_pin: bool = False
    when: dict[str, Any]
    message: Message | None = None
    error: str | None = None
    skip_message: Message | None = None
    # prefers: yield to V2 when V1 cannot serve the config (vLLM 0.31's ROCm default), or not
    # (0.29-0.30: V1 is picked, and its validation then refuses the config)
    yields: bool = True
    reason: str = ""
    reference: str = ""
    after: Identifier | None = None
    before: Identifier | None = None

    @model_validator(mode="after")
    def _one_effect(self) -> Rule:
        effects = [e for e in (self.blocks, self.forces, self.prefers) if e is not None]
        if len(effects) != 1:
            raise ValueError("a rule needs exactly one of blocks, forces, prefers")
        if self.prerequisite and self.blocks != "v2":
            raise ValueError("prerequisite: true only applies to rules that block v2")
        if not self.yields and self.prefers is None:
            raise ValueError("yields only applies to rules that prefer a runner")
        if self.after is not None and self.before is not None:
            raise ValueError("give after or before, not both")
        if self.override_pin and self.forces is None:
            raise ValueError("override_pin only applies to rules that force a runner")
        if self.blocks == "v1" and self.severity != "hard":
            raise ValueError("blocks: v1 is always hard (V1 cannot serve the config)")
        if self.forces == "v1" or self.prefers == "v2":
            raise ValueError(
                "forces: v1 and prefers: v2 are not supported; use blocks: v2 "
                "(V2 cannot serve) or leave V2 as the default"
            )
        if not self.when:
            raise ValueError("when must name at least one condition")
        return self

    @property
    def effect(self) -> str:
        if self.blocks is not None:
            return f"blocks_{self.blocks}"
        if self.forces is not None:
            return f"forces_{self.forces}"
        return f"prefers_{self.prefers}"


class Derived(_Strict):
    """A named predicate: true when any of its condition maps holds (each ANDs its own)."""

    any: list[dict[str, Any]] = Field(min_length=1)
    description: str = ""


class Step(_Strict):
    """One step of what the described engine does before (and right after) it decides, in
    order. Exactly one of: ``set`` (change values: a normalisation), ``refuse`` (stop with this
    error), ``evaluate: true`` (run the selection early; its log lines stay, its runner is
    ``early_runner``), ``final: true`` (where the selection that counts runs; steps after it
    are the checks that follow it)."""

    id: Identifier
    when: dict[str, Any] = {}
    unless: list[Identifier] = []  # skip when one of these earlier steps applied (an elif)
    set: dict[str, Any] | None = None
    refuse: str | None = None
    evaluate: bool = False
    final: bool = False
    after: Identifier | None = None
    before: Identifier | None = None
    reference: str = ""
    note: str = ""

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [self.set is not None, self.refuse is not None, self.evaluate, self.final]
        if sum(kinds) != 1:
            raise ValueError("a step needs exactly one of set, refuse, evaluate: true, final: true")
        if self.final and self.when:
            raise ValueError("the final step takes no condition")
        if self.set is not None and not self.set:
            raise ValueError("set must name at least one value")
        return self

    @property
    def kind(self) -> str:
        if self.set is not None:
            return "set"
        if self.refuse is not None:
            return "refuse"
        return "evaluate" if self.evaluate else "final"


class CapabilityMatrix(_Strict):
    """capability_matrix.yaml: the pack, its message shapes, dimensions, derived predicates,
    texts, steps and rules. ``remove_rules`` / ``remove_steps`` drop inherited ones by id.
    ``texts`` are named constants a step's ``refuse`` quotes as ``{texts.NAME}`` (a long fact
    of the release, such as its model registry, written once)."""

    pack: PackMeta
    messages: Messages = Messages()
    dimensions: dict[str, Dimension] = {}
    derived: dict[Identifier, Derived] = {}
    texts: dict[Identifier, str] = {}
    steps: list[Step] = []
    rules: list[Rule] = []
    remove_rules: list[Identifier] = []
    remove_steps: list[Identifier] = []


class Stage(_Strict):
    """A rollout stage: a cohort (families and/or attribute conditions) and its default canary."""

    id: Identifier
    label: str
    families: list[str] = []
    when: dict[str, Any] = {}
    enabled: bool = False
    percentage: Annotated[int, Field(ge=0, le=100)] = 100
    description: str = ""


class Rollout(_Strict):
    """rollout.yaml: ordered stages (first match wins), a kill switch, the default runner."""

    kill_switch: bool = False
    default_runner: Runner = "v1"
    stages: list[Stage] = []


class Family(_Strict):
    """A family: its architectures (each may override attributes) and shared attributes."""

    label: str
    attributes: dict[str, Any] = {}
    architectures: dict[str, dict[str, Any] | None]
    source: str = ""


class Families(_Strict):
    """families.yaml; ``families_from`` (a path relative to the pack) is read first and the
    file's own families replace same-named ones from it."""

    families_from: str | None = None
    families: dict[Identifier, Family] = {}


class RunnerManifestSpec(_Strict):
    """One runner's capability manifest, as ``engine.capabilities.RunnerManifest.to_json``
    writes it (the oracle reads the file; it never imports the runners)."""

    architectures: dict[Literal["generate", "pooling"], list[str]]
    speculative_methods: list[str]
    features: dict[str, bool]
    pooling_tasks: list[str]
    platforms: list[str]
    requires_triton: bool
    async_scheduling: bool
    cuda_graphs: bool
    # the generating architectures served at tensor_parallel_size > 1 (older files: none)
    tensor_parallel_architectures: list[str] = []


class ManifestsFile(_Strict):
    """The file ``pack.manifests`` names: each runner's manifest, and how it was made."""

    generated_by: str
    format: Literal[1]
    runners: dict[Runner, RunnerManifestSpec]


class KnownModel(_Strict):
    """known_models.yaml entry: facts about a model id, each with where it came from."""

    architecture: str
    quantization: str = "none"
    attributes: dict[str, Any] = {}
    source: str
    note: str = ""


class KnownModels(_Strict):
    models: dict[str, KnownModel]
