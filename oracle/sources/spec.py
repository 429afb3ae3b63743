"""Deployment specs: a mapping of DeploymentConfig fields, alone or in YAML / JSON / JSONL files.

Field names are those of the ``config`` objects of ``policies/reference/vllm031_cases.jsonl``
(the DeploymentConfig field names) plus two aliases: ``is_pooling`` (-> runner_kind) and ``id``
(-> deployment_id). A file entry may also wrap its spec as ``{id, config: {...}}``, the case
format, whose other keys (``want``, ``vllm_version``, ``note``) are metadata.

A bad entry is rejected alone, with file:line:column, while the others are still read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnout.oracle.coerce import suggest
from turnout.oracle.config import CONFIG_FIELD_NAMES, DeploymentConfig
from turnout.oracle.errors import ConfigError, ErrorCode, Issue, PackError
from turnout.oracle.yamlpos import (
    Positions,
    load_json_with_positions,
    load_text_with_positions,
    read_lines,
    read_text,
)

ALIASES = ("is_pooling", "id")
WRAPPER_METADATA = ("want", "vllm_version", "note", "source")


def spec_to_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The DeploymentConfig keyword arguments of a spec mapping (aliases resolved).

    Raises ConfigError(code=ErrorCode.UNKNOWN_FIELD) naming an unknown key and the closest
    known one.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"a spec must be a mapping of fields, got {type(spec).__name__}",
            code=ErrorCode.BAD_SPEC,
        )
    fields: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "is_pooling":
            if not isinstance(value, bool):
                raise ConfigError(
                    f"is_pooling: expected true or false, got {value!r}",
                    code=ErrorCode.BAD_VALUE,
                    field=key,
                )
            fields["runner_kind"] = "pooling" if value else "generate"
        elif key == "id":
            fields.setdefault("deployment_id", None if value is None else str(value))
        elif key in CONFIG_FIELD_NAMES:
            fields[key] = value
        else:
            known = list(CONFIG_FIELD_NAMES) + list(ALIASES)
            raise ConfigError(
                f"unknown field {key!r}{suggest(str(key), known)}",
                code=ErrorCode.UNKNOWN_FIELD,
                field=str(key),
            )
    return fields


def from_spec(spec: Mapping[str, Any]) -> DeploymentConfig:
    """A DeploymentConfig from a spec mapping (field names of vllm031_cases.jsonl ``config``
    objects, plus the aliases ``is_pooling`` -> runner_kind and ``id`` -> deployment_id).

    Raises ConfigError(code=ErrorCode.UNKNOWN_FIELD) for any other key, and the constructor's
    ConfigError for a bad value.
    """
    return DeploymentConfig(**spec_to_fields(spec))


@dataclass(frozen=True)
class SpecEntry:
    """One deployment of a spec file: its config, or the error that rejected it.

    ``where`` is "file:line" of the entry; ``id`` echoes the spec's ``id`` (or deployment_id).
    """

    id: str | None
    config: DeploymentConfig | None
    error: str | None
    where: str
    error_code: ErrorCode | None = None


def _entry(raw: Any, pos: Positions, path: tuple[Any, ...]) -> SpecEntry:
    line, col = pos.at(path)
    where = f"{pos.file}:{line}"
    if not isinstance(raw, Mapping):
        return SpecEntry(
            None,
            None,
            f"{pos.file}:{line}:{col}: a spec must be a mapping",
            where,
            ErrorCode.BAD_SPEC,
        )
    spec, spec_path = raw, path
    if isinstance(raw.get("config"), Mapping):
        extra = set(raw) - {"id", "config", *WRAPPER_METADATA}
        if extra:
            key = sorted(extra)[0]
            ln, cl = pos.at((*path, key), prefer_key=True)
            return SpecEntry(
                _id(raw),
                None,
                f"{pos.file}:{ln}:{cl}: unknown key {key!r} next "
                "to config (expected id, config, " + ", ".join(WRAPPER_METADATA) + ")",
                where,
                ErrorCode.UNKNOWN_FIELD,
            )
        spec = {"id": raw["id"], **raw["config"]} if "id" in raw else raw["config"]
        spec_path = (*path, "config")
    try:
        return SpecEntry(_id(spec), from_spec(spec), None, where)
    except ConfigError as exc:
        key_path = (*spec_path, exc.field) if exc.field else spec_path
        prefer_key = exc.code == ErrorCode.UNKNOWN_FIELD
        ln, cl = pos.at(key_path, prefer_key=prefer_key)
        return SpecEntry(_id(spec), None, f"{pos.file}:{ln}:{cl}: {exc.message}", where, exc.code)


def _id(spec: Mapping[str, Any]) -> str | None:
    value = spec.get("id", spec.get("deployment_id"))
    return None if value is None else str(value)


def load_specs(path: str | Path) -> list[SpecEntry]:
    """Every deployment of a spec file (.yaml/.yml/.json: a mapping or a list; .jsonl: one a line).

    Raises ConfigError (``FILE_NOT_FOUND``, ``BAD_SPEC``) only when the file as a whole cannot
    be read; a bad entry comes back as a SpecEntry with ``error`` set.
    """
    p = Path(path)
    try:
        if p.suffix == ".jsonl":
            return _load_jsonl(read_lines(p), str(p))
        text = read_text(p)
        load = load_json_with_positions if p.suffix == ".json" else load_text_with_positions
        data, pos = load(text, str(p))
    except OSError as exc:
        raise ConfigError(
            f"cannot read spec file {p}: {exc.strerror or exc}", code=ErrorCode.FILE_NOT_FOUND
        ) from None
    except PackError as exc:
        raise ConfigError(str(exc), code=ErrorCode.BAD_SPEC) from None
    if isinstance(data, Mapping) and isinstance(data.get("deployments"), list):
        return [_entry(item, pos, ("deployments", i)) for i, item in enumerate(data["deployments"])]
    if isinstance(data, list):
        return [_entry(item, pos, (i,)) for i, item in enumerate(data)]
    return [_entry(data, pos, ())]


def _load_jsonl(lines: list[str | Issue], name: str) -> list[SpecEntry]:
    out: list[SpecEntry] = []
    for n, line in enumerate(lines, start=1):
        if isinstance(line, Issue):
            out.append(
                SpecEntry(
                    None,
                    None,
                    f"{name}:{n}:{line.column}: {line.message}",
                    f"{name}:{n}",
                    ErrorCode.BAD_SPEC,
                )
            )
            continue
        if not line.strip():
            continue
        try:
            data, lpos = load_json_with_positions(line, name)
        except PackError as exc:
            issue = exc.issues[0]
            out.append(
                SpecEntry(
                    None,
                    None,
                    f"{name}:{n}:{issue.column}: {issue.message}",
                    f"{name}:{n}",
                    ErrorCode.BAD_SPEC,
                )
            )
            continue
        pos = Positions(
            name,
            {k: (n, c) for k, (_, c) in lpos.value.items()},
            {k: (n, c) for k, (_, c) in lpos.key.items()},
        )
        pos.value.setdefault((), (n, 1))
        out.append(_entry(data, pos, ()))
    return out
