"""The schema of DeploymentConfig's fields, their closed vocabularies, and the dimensions a
pack can use beyond the fields.

Each field is declared once, in :class:`oracle.config.DeploymentConfig`, through
:func:`declare`: its default, kind, meaning, group, vocabulary and check travel as the
dataclass field's metadata. ``oracle.config.FIELDS`` / ``FIELD_INFO`` (the coercion table and
the field table of docs/oracle-api.md) are derived from it.

Field names follow vLLM's engine arguments where one exists (docs/architecture.md §3.1).
``None`` for a model attribute means "take it from the pack's families.yaml"; ``None`` for
``async_scheduling`` means "not set explicitly" (vLLM only refuses some combinations when the
user asked for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

Kind = Literal["bool", "opt_bool", "int", "float", "str", "enum", "list", "env", "json"]
Check = Callable[["FieldInfo", Any], Any]
"""A value check: (the field, a raw value that is not None) -> the checked value; raises
ConfigError naming the field."""
_T = TypeVar("_T")
_METADATA_KEY = "oracle.field"


@dataclass(frozen=True)
class FieldInfo:
    """Metadata of one DeploymentConfig field.

    ``vocab`` is the closed domain of an ``enum`` field (None: open). ``changeable`` says whether
    ``explain`` may suggest changing it (deployment options yes, model facts no). ``minimum`` is
    the smallest value an ``int`` field accepts. ``check`` replaces the kind's value check for a
    field that needs its own (:mod:`oracle.coerce`).
    """

    name: str
    kind: Kind
    doc: str
    group: str
    vocab: tuple[str, ...] | None = None
    changeable: bool = True
    minimum: int = 0
    check: Check | None = None


def declare(
    default: _T,
    kind: Kind,
    doc: str,
    group: str,
    vocab: tuple[str, ...] | None = None,
    *,
    changeable: bool = True,
    minimum: int = 0,
    check: Check | None = None,
) -> _T:
    """A DeploymentConfig field with its metadata: ``name: type = declare(default, kind, ...)``.

    Typed as the default so the dataclass sees the field's type; the FieldInfo it carries is
    named by :func:`field_infos`.
    """
    info = FieldInfo("", kind, doc, group, vocab, changeable, minimum, check)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: info})


def field_infos(cls: type) -> tuple[FieldInfo, ...]:
    """The FieldInfo of every declared field of dataclass ``cls``, named, in order."""
    return tuple(
        dataclasses.replace(f.metadata[_METADATA_KEY], name=f.name)
        for f in dataclasses.fields(cls)
        if _METADATA_KEY in f.metadata
    )


PLATFORMS = ("cuda", "rocm", "cpu", "xpu", "tpu", "npu")
# vLLM's speculative methods after argument resolution: model-specific MTP names (deepseek_mtp,
# qwen3_next_mtp, ...) resolve to "mtp" (vllm/config/speculative.py); "none" = no speculation.
SPECULATIVE_METHODS = (
    "none",
    "ngram",
    "ngram_gpu",
    "suffix",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "eagle",
    "eagle3",
    "mtp",
    "dflash",
    "dspark",
    "extract_hidden_states",
    "custom_class",
)
# vLLM CompilationMode names (vllm/config/compilation.py), lower-cased.
COMPILATION_MODES = ("none", "stock_torch_compile", "dynamo_trace_once", "vllm_compile")
CUDAGRAPH_MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")
MAMBA_CACHE_MODES = ("none", "align", "all")
RUNNER_KINDS = ("generate", "pooling")
# vllm/config/parallel.py All2AllBackend (0.29-0.33, union)
ALL2ALL_BACKENDS = (
    "allgather_reducescatter",
    "naive",
    "pplx",
    "deepep_high_throughput",
    "deepep_low_latency",
    "deepep_v2",
    "mori_high_throughput",
    "mori_low_latency",
    "moonep",
    "nixl_ep",
    "flashinfer_all2allv",
    "flashinfer_nvlink_two_sided",
    "flashinfer_nvlink_one_sided",
    "passthrough",
)
# Compute capabilities of the CUDA and ROCm devices vLLM's checks name (major.minor).
DEVICE_CAPABILITIES = (
    "7.0",
    "7.5",
    "8.0",
    "8.6",
    "8.7",
    "8.9",
    "9.0",
    "10.0",
    "10.1",
    "10.3",
    "11.0",
    "12.0",
    "12.1",
    "9.4",
    "9.5",
)
# vllm/config/speculative.py draft_lm_head_quantization (0.33)
DRAFT_LM_HEAD_QUANTIZATIONS = ("fp8", "nvfp4")

# Model attributes that families.yaml supplies when the config leaves them None.
FAMILY_ATTRIBUTES: tuple[str, ...] = (
    "is_moe",
    "use_mla",
    "has_inner_state",
    "is_hybrid",
    "attention_free",
    "is_multimodal",
    "is_encoder_decoder",
    "is_diffusion",
    "runner_kind",
    "has_index_topk",
    "supports_mamba_prefix_caching",
)

# Dimensions computed from the config and its family, usable in rules and cohorts.
DERIVED_DIMENSIONS: dict[str, str] = {
    "family": "the family of the architecture (families.yaml), or the config's override",
    "quantized": "quantization is not 'none'",
    "pooling": "runner_kind is 'pooling'",
    "runner_pin": "the pack's runner variable: 'auto' (unset), 'v1' or 'v2'",
    "kv_connector": "kv_transfer_config's `kv_connector` (None without one)",
    "kv_role": "kv_transfer_config's `kv_role` (None without one)",
    "kv_connector_module_path": "kv_transfer_config's `kv_connector_module_path` (None without one)",
    "early_runner": "the runner of the last early evaluation of a pack's steps (None before one)",
}
RUNNER_PINS = ("auto", "v1", "v2")


_KIND_TEXT = {
    "bool": "bool",
    "opt_bool": "bool",
    "int": "int",
    "float": "float",
    "str": "str",
    "enum": "str",
    "list": "tuple of str",
    "env": "str -> str",
    "json": "JSON object",
}


def _default_text(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}" if not value else repr(dict(value))
    return "None" if value is None else repr(value)


def field_table(infos: Sequence[FieldInfo], defaults: Mapping[str, Any]) -> str:
    """The Markdown table of the fields (docs/oracle-api.md holds it; a test compares)."""
    rows = ["| group | field | type | default | meaning |", "|---|---|---|---|---|"]
    for f in infos:
        kind = (
            _KIND_TEXT[f.kind]
            + (f" >= {f.minimum}" if f.minimum else "")
            + (" or None" if defaults[f.name] is None else "")
        )
        doc = f.doc + ("; one of " + ", ".join(f"`{v}`" for v in f.vocab) if f.vocab else "")
        rows.append(
            f"| {f.group} | `{f.name}` | {kind} | `{_default_text(defaults[f.name])}` | {doc} |"
        )
    return "\n".join(rows) + "\n"
