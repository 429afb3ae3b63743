"""DeploymentConfig: the frozen, hashable value a decision is made about (DESIGN §3.1).

Build one from keyword arguments here; :mod:`oracle.sources` builds one from a spec mapping
(``from_spec``), a ``vllm serve`` command line with its environment (``from_command``) or an HF
``config.json`` (``from_hf_config``), and imports this module (never the reverse). Every value
is checked on construction; bad input raises :class:`~oracle.errors.ConfigError` naming the
field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
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
        """A JSON-ready spec that :func:`oracle.sources.from_spec` turns back into an equal
        config."""
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


_FIELDS = tuple(f for f in dataclasses.fields(DeploymentConfig) if f.name != "_hash")
_DEFAULTS: dict[str, Any] = {
    f.name: FrozenMap() if f.default is dataclasses.MISSING else f.default for f in _FIELDS
}
CONFIG_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in _FIELDS)
_FIELD_SET = frozenset(CONFIG_FIELD_NAMES)
