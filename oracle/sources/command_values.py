"""Values of the JSON-valued and derived ``vllm serve`` flags -> DeploymentConfig fields."""

from __future__ import annotations

import json
from typing import Any

from oracle.errors import ConfigError, ErrorCode
from oracle.sources.command_flags import (
    COMPILATION_MODE_NUMBERS,
    IGNORED_SPECULATIVE_KEYS,
    POOLING_CONVERSIONS,
)

_SCALARS = {"true": True, "false": False, "none": None, "null": None}


def parse_json_value(text: str, *, strict: bool, flag: str = "") -> Any:
    """A flag value: JSON when it looks like JSON, else a scalar (``True`` -> true, ``8`` -> 8).

    ``strict``: a value starting with ``{`` or ``[`` must be valid JSON (ConfigError naming
    ``flag`` otherwise).
    """
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as exc:
            if strict:
                raise ConfigError(f"{flag}: invalid JSON value ({exc.msg} at column "
                                  f"{exc.colno}): {text!r}", code=ErrorCode.BAD_FLAG_VALUE,
                                  field=flag) from None
            return text
    if stripped.lower() in _SCALARS:
        return _SCALARS[stripped.lower()]
    for convert in (int, float):
        try:
            return convert(stripped)
        except ValueError:
            pass
    return text


def _speculative(cfg: dict[str, Any], fields: dict[str, Any], ignored: list[str]) -> None:
    method = cfg.get("method")
    model = cfg.get("model")
    if method is None and isinstance(model, str):
        # vLLM's SpeculativeConfig infers the method from the draft model's name.
        low = model.lower()
        method = ("eagle3" if "eagle3" in low else "eagle" if "eagle" in low else
                  "medusa" if "medusa" in low else
                  "mlp_speculator" if "speculator" in low else
                  "ngram" if low == "[ngram]" else "draft_model")
    if method is None:
        raise ConfigError("--speculative-config needs a method (or a draft model)",
                          code=ErrorCode.BAD_FLAG_VALUE, field="--speculative-config")
    fields["speculative_method"] = method
    if "num_speculative_tokens" in cfg:
        fields["num_speculative_tokens"] = cfg["num_speculative_tokens"]
    if "parallel_drafting" in cfg:
        fields["parallel_drafting"] = cfg["parallel_drafting"]
    for key in cfg:
        if key not in ("method", "num_speculative_tokens", "parallel_drafting"):
            if key not in IGNORED_SPECULATIVE_KEYS:
                raise ConfigError(f"--speculative-config: unknown key {key!r}",
                                  code=ErrorCode.BAD_FLAG_VALUE, field="--speculative-config")
            ignored.append(f"--speculative-config.{key}")


def _compilation_mode(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value in \
            COMPILATION_MODE_NUMBERS:
        return COMPILATION_MODE_NUMBERS[value]
    if isinstance(value, str):
        return value.lower()
    raise ConfigError(f"--compilation-config: mode must be 0-3 or a CompilationMode name, got "
                      f"{value!r}", code=ErrorCode.BAD_FLAG_VALUE, field="--compilation-config")


def _compilation(cfg: dict[str, Any], fields: dict[str, Any], ignored: list[str]) -> None:
    for key, value in cfg.items():
        if key in ("mode", "level", ""):
            fields["compilation_mode"] = _compilation_mode(value)
        elif key == "cudagraph_mode":
            fields["cudagraph_mode"] = str(value).lower()
        elif key == "pass_config" and isinstance(value, dict):
            for pkey, pvalue in value.items():
                if pkey in ("enable_sp", "enable_sequence_parallelism"):
                    fields["enable_sequence_parallelism"] = bool(pvalue)
                else:
                    ignored.append(f"--compilation-config.pass_config.{pkey}")
        else:
            ignored.append(f"--compilation-config.{key}")


def _runner_kind(flag: str, value: Any, fields: dict[str, Any]) -> None:
    v = str(value).lower()
    if flag == "--runner" and v in ("generate", "pooling"):
        fields["runner_kind"] = v
    elif v in POOLING_CONVERSIONS:
        fields["runner_kind"] = "pooling"
    elif v == "generate":
        fields["runner_kind"] = "generate"
    elif v not in ("auto", "none", "draft"):
        raise ConfigError(f"{flag}: unknown value {value!r}", code=ErrorCode.BAD_FLAG_VALUE,
                          field=flag)


def apply_json_flags(flags: dict[str, dict[str, Any]], fields: dict[str, Any],
                     ignored: list[str]) -> None:
    """Fold the collected JSON-valued / derived flags into ``fields`` (see command_flags)."""
    for flag, cfg in flags.items():
        if flag == "--speculative-config":
            _speculative(cfg, fields, ignored)
        elif flag == "--compilation-config":
            _compilation(cfg, fields, ignored)
        elif flag == "--kv-transfer-config":
            fields["kv_transfer_config"] = dict(cfg)
        elif flag == "--hf-overrides":
            archs = cfg.get("architectures")
            if isinstance(archs, list) and archs and isinstance(archs[0], str):
                fields["architecture"] = archs[0]
            ignored += [f"--hf-overrides.{k}" for k in cfg if k != "architectures"]
        elif flag in ("--runner", "--convert", "--task"):
            _runner_kind(flag, cfg.get("", ""), fields)
        elif flag == "--attention-backend":
            fields["_attention_backend"] = cfg.get("", "")
            ignored.append(f"--attention-backend {cfg.get('', '')}")
