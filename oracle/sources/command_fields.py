"""The parsed ``vllm serve`` flags that the decision reads -> DeploymentConfig fields.

Every flag of the release's table is accepted (the parser checked it); the few below feed a
field, the rest are listed in ``ParsedCommand.ignored`` (they change nothing about which runner
can serve). :data:`DIRECT` maps a dest to the field it sets as parsed; the JSON-valued and
derived flags are folded by :func:`to_fields`: ``--speculative-config`` (and ``--spec-method``
/ ``--spec-model`` / ``--spec-tokens``), ``--compilation-config``, ``--kv-transfer-config``,
``--attention-config``, ``--watermark-config``, ``--hf-overrides`` (``architectures``),
``--runner`` / ``--convert`` (pooling), ``--attention-backend`` (a ROCm hint).
"""

from __future__ import annotations

import json
from typing import Any

from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.sources.command_table import FlagTable

# dest -> DeploymentConfig field, value as the parser gave it
DIRECT: dict[str, str] = {
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "prefill_context_parallel_size": "prefill_context_parallel_size",
    "decode_context_parallel_size": "decode_context_parallel_size",
    "enable_expert_parallel": "enable_expert_parallel",
    "distributed_executor_backend": "distributed_executor_backend",
    "enable_dbo": "enable_dbo",
    "ubatch_size": "ubatch_size",
    "enable_elastic_ep": "enable_elastic_ep",
    "enable_eplb": "enable_eplb",
    "enable_batch_sharded_sampling": "enable_batch_sharded_sampling",
    "all2all_backend": "all2all_backend",
    "enforce_eager": "enforce_eager",
    "logits_processors": "logits_processors",
    "kv_sharing_fast_prefill": "kv_sharing_fast_prefill",
    "mamba_cache_mode": "mamba_cache_mode",
    "cpu_offload_gb": "cpu_offload_gb",
    "async_scheduling": "async_scheduling",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_lora": "lora",
    "quantization": "quantization",
    "mm_encoder_only": "mm_encoder_only",
}
# dest -> where command.py finds the model's config.json (oracle/sources/hub.py), not a field
MODEL_SOURCE: dict[str, str] = {"revision": "_revision", "hf_config_path": "_hf_config_path"}
# handled by to_fields (JSON values, derived fields); model_tag is the model
DERIVED = (
    "model_tag",
    "speculative_config",
    "spec_method",
    "spec_model",
    "spec_tokens",
    "compilation_config",
    "kv_transfer_config",
    "attention_config",
    "watermark_config",
    "hf_overrides",
    "runner",
    "convert",
    "attention_backend",
)
SPECULATIVE_DESTS = ("speculative_config", "spec_method", "spec_model", "spec_tokens")
SPECULATIVE_FIELDS = (
    "num_speculative_tokens",
    "parallel_drafting",
    "enable_adaptive_verification",
    "disable_padded_drafter_batch",
    "use_heterogeneous_vocab",
    "draft_lm_head_quantization",
)
COMPILATION_MODE_NUMBERS = {
    0: "none",
    1: "stock_torch_compile",
    2: "dynamo_trace_once",
    3: "vllm_compile",
}


def _bad(flag: str, message: str) -> ConfigError:
    return ConfigError(f"{flag}: {message}", code=ErrorCode.BAD_FLAG_VALUE, field=flag)


def speculative(given: dict[str, Any], table: FlagTable) -> dict[str, Any]:
    """``--speculative-config`` with ``--spec-*`` folded in, checked as vLLM's engine checks
    it at start-up (``EngineArgs.create_speculative_config``: ``SpeculativeConfig(**d)``)."""
    spec = given.get("speculative_config")
    if spec is not None and not isinstance(spec, dict):
        raise _bad(
            "--speculative-config",
            f"a JSON object is needed, not a "
            f"{type(spec).__name__} (vLLM {table.release} fails on it when the engine "
            "builds SpeculativeConfig)",
        )
    spec = dict(spec or {})
    for flag, key in (
        ("--spec-method", "method"),
        ("--spec-model", "model"),
        ("--spec-tokens", "num_speculative_tokens"),
    ):
        value = given.get(flag[2:].replace("-", "_"))
        if value is None:
            continue
        if key in spec:
            raise _bad(flag, f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        spec[key] = value
    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    known = table.config_fields("SpeculativeConfig")
    unknown = [k for k in spec if k not in known]
    if unknown:
        raise _bad(
            "--speculative-config",
            f"1 validation error for SpeculativeConfig; "
            f"{unknown[0]}: Unexpected keyword argument (vLLM {table.release} refuses it "
            "when the engine builds SpeculativeConfig)",
        )
    return spec


def _method(spec: dict[str, Any]) -> str:
    method, model = spec.get("method"), spec.get("model")
    if method is None and isinstance(model, str):
        # vLLM's SpeculativeConfig infers the method from the draft model's name.
        low = model.lower()
        method = (
            "eagle3"
            if "eagle3" in low
            else "eagle"
            if "eagle" in low
            else "medusa"
            if "medusa" in low
            else "mlp_speculator"
            if "speculator" in low
            else "ngram"
            if low == "[ngram]"
            else "draft_model"
        )
    if method is None:
        raise _bad("--speculative-config", "needs a method (or a draft model)")
    return str(method)


def _fold_speculative(spec: dict[str, Any], fields: dict[str, Any], ignored: list[str]) -> None:
    fields["speculative_method"] = _method(spec)
    for key, value in spec.items():
        if key in SPECULATIVE_FIELDS:
            fields[key] = value
        elif key == "model" and isinstance(value, str) and value != "[ngram]":
            fields["_draft_model"] = value  # its config.json is read with the target's
        elif key != "method":
            ignored.append(f"--speculative-config.{key}")


def compilation_mode(value: Any, table: FlagTable) -> str:
    """A CompilationMode given as a number, a digit string or a name -> the field's value."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in COMPILATION_MODE_NUMBERS:
            raise _bad("--compilation-config", f"mode must be 0-3, got {value}")
        return COMPILATION_MODE_NUMBERS[value]
    return str(value).lower()


def cudagraph_mode(value: Any, table: FlagTable) -> str:
    """A CUDAGraphMode given by name (any case) or by value (``1``, ``[2, 0]``)."""
    if isinstance(value, str):
        return value.lower()
    members = table.enums.get("CUDAGraphMode", {"names": [], "values": []})
    for name, member in zip(members["names"], members["values"], strict=True):
        if member == value:
            return str(name).lower()
    return json.dumps(value)


def _fold_compilation(
    cfg: dict[str, Any], fields: dict[str, Any], ignored: list[str], table: FlagTable
) -> None:
    for key, value in cfg.items():
        if key in ("mode", "level") and value is not None:
            fields["compilation_mode"] = compilation_mode(value, table)
        elif key == "cudagraph_mode" and value is not None:
            fields["cudagraph_mode"] = cudagraph_mode(value, table)
        elif key == "pass_config" and isinstance(value, dict):
            for pkey, pvalue in value.items():
                if pkey in ("enable_sp", "enable_sequence_parallelism") and pvalue is not None:
                    fields["enable_sequence_parallelism"] = bool(pvalue)
                else:
                    ignored.append(f"--compilation-config.pass_config.{pkey}")
        else:
            ignored.append(f"--compilation-config.{key}")


def _runner_kind(given: dict[str, Any], fields: dict[str, Any]) -> None:
    runner, convert = given.get("runner"), given.get("convert")
    if runner in ("generate", "pooling"):
        fields["runner_kind"] = runner
    if convert not in (None, "auto", "none"):
        fields["runner_kind"] = "pooling"  # embed, classify (reward in older releases)


def _fold_json(
    given: dict[str, Any], fields: dict[str, Any], ignored: list[str], table: FlagTable
) -> None:
    if isinstance(given.get("compilation_config"), dict):
        _fold_compilation(given["compilation_config"], fields, ignored, table)
    if given.get("kv_transfer_config") is not None:
        fields["kv_transfer_config"] = dict(given["kv_transfer_config"])
    attention = given.get("attention_config")
    if isinstance(attention, dict):
        if attention.get("hisparse_config") is not None:
            fields["hisparse"] = True
        if attention.get("backend"):
            fields["_attention_backend"] = attention["backend"]
        ignored += [f"--attention-config.{k}" for k in attention if k != "hisparse_config"]
    if given.get("watermark_config") is not None:
        fields["watermark"] = True
    overrides = given.get("hf_overrides")
    if overrides is not None and not isinstance(overrides, dict):
        # vLLM's ModelConfig takes a dict (or a callable from Python): the engine would not start
        raise ConfigError(
            f"--hf-overrides: expected a JSON object, got {overrides!r}",
            code=ErrorCode.BAD_FLAG_VALUE,
            field="--hf-overrides",
        )
    if isinstance(overrides, dict):
        if "architectures" in overrides:
            archs = overrides["architectures"]
            if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
                raise ConfigError(
                    "--hf-overrides: architectures must be a non-empty list of "
                    f"architecture names, got {archs!r}",
                    code=ErrorCode.BAD_FLAG_VALUE,
                    field="--hf-overrides",
                )
            fields["architecture"] = archs[0]
        ignored += [f"--hf-overrides.{k}" for k in overrides if k != "architectures"]


def to_fields(given: dict[str, Any], table: FlagTable) -> tuple[dict[str, Any], list[str]]:
    """``(fields, ignored)`` for the flags a line gave (dest -> parsed value)."""
    fields: dict[str, Any] = {}
    ignored: list[str] = []
    for dest, value in given.items():
        if dest in DIRECT:
            if value is not None:
                fields[DIRECT[dest]] = (
                    tuple(v for v in value if v is not None)
                    if dest == "logits_processors"
                    else value
                )
        elif dest in MODEL_SOURCE:
            if value is not None:
                fields[MODEL_SOURCE[dest]] = value
        elif dest not in DERIVED:
            ignored.append(describe(dest, value, table))
    if any(given.get(d) is not None for d in SPECULATIVE_DESTS):
        _fold_speculative(speculative(given, table), fields, ignored)
    _fold_json(given, fields, ignored, table)
    _runner_kind(given, fields)
    if given.get("attention_backend"):
        fields["_attention_backend"] = given["attention_backend"]
        ignored.append(f"--attention-backend {given['attention_backend']}")
    return fields, ignored


def describe(dest: str, value: Any, table: FlagTable) -> str:
    """A flag as the ignored list shows it: ``--port 8001``, ``--no-enable-log-requests``."""
    row = table.action(dest)
    name = next((o for o in row["option_strings"] if o.startswith("--")), dest) if row else dest
    if isinstance(value, bool) and row and row["nargs"] == 0:
        return name if value else next((o for o in row.get("negative", ()) if o), name)
    if isinstance(value, list):
        return " ".join([name, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)])
    return f"{name} {json.dumps(value) if isinstance(value, dict) else value}"
