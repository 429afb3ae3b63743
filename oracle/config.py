"""DeploymentConfig: the frozen, hashable value a decision is made about (DESIGN §3.1).

Build one from keyword arguments, a spec mapping (the field names of the ``config`` objects in
``policies/reference/vllm031_cases.jsonl``), a ``vllm serve`` command line with its environment,
or an HF ``config.json``. Every value is checked on construction; bad input raises
:class:`~oracle.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.coerce import FrozenMap, coerce_field


@dataclass(frozen=True, eq=True, repr=False, slots=True)
class DeploymentConfig:
    """One deployment's dimensions. Field meanings: :data:`oracle.fields.FIELDS`.

    ``None`` on a model attribute (``is_moe``, ``runner_kind``, ...) means "from the pack's
    families.yaml". The hash is computed once, so a config can key caches cheaply.
    """

    deployment_id: str | None = None
    model: str | None = None
    architecture: str | None = None
    model_type: str | None = None
    family: str | None = None
    quantization: str = "none"
    runner_kind: str | None = None
    is_moe: bool | None = None
    use_mla: bool | None = None
    has_inner_state: bool | None = None
    is_hybrid: bool | None = None
    attention_free: bool | None = None
    is_multimodal: bool | None = None
    is_encoder_decoder: bool | None = None
    is_diffusion: bool | None = None
    platform: str = "cuda"
    triton_available: bool = True
    speculative_method: str = "none"
    num_speculative_tokens: int = 0
    parallel_drafting: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    enable_expert_parallel: bool = False
    enable_sequence_parallelism: bool = False
    distributed_executor_backend: str | None = None
    enable_dbo: bool = False
    ubatch_size: int = 0
    enable_elastic_ep: bool = False
    enable_eplb: bool = False
    compilation_mode: str = "vllm_compile"
    cudagraph_mode: str | None = None
    enforce_eager: bool = False
    logits_processors: tuple[str, ...] = ()
    logits_processor_plugins: tuple[str, ...] = ()
    kv_sharing_fast_prefill: bool = False
    mamba_cache_mode: str | None = None
    cpu_offload_gb: float = 0.0
    kv_transfer_config: bool = False
    async_scheduling: bool | None = None
    enable_prefix_caching: bool | None = None
    lora: bool = False
    hisparse: bool = False
    watermark: bool = False
    env: Mapping[str, str] = field(default_factory=FrozenMap)
    _hash: int = field(init=False, compare=False, default=0)

    def __post_init__(self) -> None:
        for f in _FIELDS:
            raw = getattr(self, f.name)
            value = coerce_field(f.name, raw)
            if value is None:
                value = _DEFAULTS[f.name]
            if value is not raw:
                object.__setattr__(self, f.name, value)
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in _FIELDS)))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"DeploymentConfig({', '.join(f'{k}={v!r}' for k, v in self.changed().items())})"

    # -- views -------------------------------------------------------------------------------

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults (what a spec would need to say)."""
        out: dict[str, Any] = {}
        for f in _FIELDS:
            value = getattr(self, f.name)
            if value != _DEFAULTS[f.name]:
                out[f.name] = dict(value) if f.name == "env" else value
        return out

    def to_spec(self) -> dict[str, Any]:
        """A JSON-ready spec that :meth:`from_spec` turns back into an equal config."""
        out = self.changed()
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out

    def replace(self, **changes: Any) -> DeploymentConfig:
        """A copy with ``changes`` applied (checked like the constructor). Raises ConfigError
        (``unknown_field``, with the closest field name) for a name that is not a field."""
        for name in changes:
            if name not in _FIELD_SET:
                coerce_field(name, None)  # raises the unknown_field error, "did you mean"
        return dataclasses.replace(self, **changes)

    def _trusted_replace(self, changes: Mapping[str, Any]) -> DeploymentConfig:
        """A copy with ``changes`` that are already checked (values from a pack's validated
        domains); skips the per-field checks, for enumerating many cells fast."""
        new = object.__new__(DeploymentConfig)
        values = []
        for name in CONFIG_FIELD_NAMES:
            value = changes[name] if name in changes else getattr(self, name)
            object.__setattr__(new, name, value)
            values.append(value)
        object.__setattr__(new, "_hash", hash(tuple(values)))
        return new

    def runner_env(self, name: str) -> str | None:
        """The value of the runner-selection variable ``name``, or None when unset."""
        return self.env.get(name)

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> DeploymentConfig:
        """Build from a spec mapping (field names of vllm031_cases.jsonl ``config`` objects).

        Accepts every field name plus the aliases ``is_pooling`` (-> runner_kind) and ``id``
        (-> deployment_id). Raises ConfigError(code="unknown_field") for anything else.
        """
        from oracle.spec import spec_to_fields

        return cls(**spec_to_fields(spec))

    @classmethod
    def from_command(cls, argv: Sequence[str] | str, env: Mapping[str, str] | None = None, *,
                     architecture: str | None = None, hf_config: str | Path | None = None,
                     base_dir: str | Path | None = None, hint_for: str = "python",
                     **overrides: Any) -> DeploymentConfig:
        """Build from a real ``vllm serve MODEL [flags]`` command line and its environment.

        ``argv`` is a list (or a shell string, split with shlex). The model id is looked up in
        ``policies/known_models.yaml`` unless ``architecture`` or ``hf_config`` is given or the
        model is a local directory with a config.json. Raises ConfigError for a placeholder
        model, an unknown model, an unknown flag or a bad flag value (the message names it);
        ``hint_for`` ("python", "cli", "api", "page") words how to give an architecture the oracle
        cannot find, and an unknown model's message names the architectures its name suggests.
        """
        from oracle.command import command_to_fields

        fields = command_to_fields(argv, env or {}, architecture=architecture,
                                   hf_config=hf_config, base_dir=base_dir,
                                   hint_for=hint_for).fields  # type: ignore[arg-type]
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_hf_config(cls, path_or_mapping: str | Path | Mapping[str, Any],
                       **overrides: Any) -> DeploymentConfig:
        """Build from a local HF ``config.json`` (a file, its directory, or the parsed mapping).

        Sets architecture, model_type, quantization and the model attributes the config shows
        (is_moe from expert counts, use_mla from kv_lora_rank, ...); ``overrides`` win.
        """
        from oracle.hf_config import hf_config_to_fields

        fields = hf_config_to_fields(path_or_mapping)
        fields.update(overrides)
        return cls(**fields)


_FIELDS = tuple(f for f in dataclasses.fields(DeploymentConfig) if f.name != "_hash")
_DEFAULTS: dict[str, Any] = {
    f.name: FrozenMap() if f.default is dataclasses.MISSING else f.default for f in _FIELDS
}
CONFIG_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in _FIELDS)
_FIELD_SET = frozenset(CONFIG_FIELD_NAMES)
