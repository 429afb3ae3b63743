"""Turn the CLI's inputs (a command line, a spec file, a commands file, keyword options) into
a list of deployments to decide, each with its id, its config or the error that rejected it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.config import DeploymentConfig
from oracle.errors import ConfigError, ErrorCode, Issue
from oracle.sources import command_to_fields, from_hf_config, load_specs
from oracle.sources.command_values import parse_json_value
from oracle.yamlpos import read_lines


@dataclass(frozen=True)
class Item:
    """One deployment to decide: a config, or the bad-input error that rejected it."""

    id: str | None
    config: DeploymentConfig | None
    error: str | None = None
    error_code: ErrorCode | None = None
    model: str | None = None
    model_source: str | None = None  # where the model's config.json came from, for people


@dataclass(frozen=True)
class Overrides:
    """CLI options that apply to every deployment of the run."""

    architecture: str | None = None
    hf_config: Path | None = None
    platform: str | None = None
    deployment_id: str | None = None
    env: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.platform:
            out["platform"] = self.platform
        if self.deployment_id:
            out["deployment_id"] = self.deployment_id
        for item in self.sets:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ConfigError(f"--set expects FIELD=VALUE, got {item!r}",
                                  code=ErrorCode.BAD_VALUE)
            out[key.strip()] = parse_json_value(value, strict=True, flag=f"--set {key}")
        return out

    def env_map(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.env:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ConfigError(f"--env expects NAME=VALUE, got {item!r}",
                                  code=ErrorCode.BAD_VALUE)
            out[key] = value
        return out


def _with(config: DeploymentConfig, fields: dict[str, Any], env: dict[str, str]
          ) -> DeploymentConfig:
    if env:
        fields = fields | {"env": {**config.env, **env}}
    return config.replace(**fields) if fields else config


def from_command_line(argv: list[str], ov: Overrides) -> Item:
    """The deployment of one ``vllm serve`` command line."""
    try:
        parsed = command_to_fields(argv, ov.env_map(), architecture=ov.architecture,
                                   hf_config=ov.hf_config, hint_for="cli")
        cfg = DeploymentConfig(**parsed.fields)
        source = parsed.model_source.describe() if parsed.model_source else None
        return Item(ov.deployment_id, _with(cfg, ov.fields(), {}), model=cfg.model,
                    model_source=source)
    except ConfigError as exc:
        return Item(ov.deployment_id, None, exc.message, exc.code)


def from_keywords(ov: Overrides) -> Item:
    """The deployment given by --architecture / --config / --set options alone."""
    try:
        if ov.hf_config is not None:
            cfg = from_hf_config(ov.hf_config)
        else:
            cfg = DeploymentConfig(architecture=ov.architecture)
        return Item(ov.deployment_id, _with(cfg, ov.fields(), ov.env_map()))
    except ConfigError as exc:
        return Item(ov.deployment_id, None, exc.message, exc.code)


def from_spec_file(path: Path, ov: Overrides) -> list[Item]:
    """Every deployment of a spec file; overrides apply to each."""
    items = []
    extra, env = ov.fields(), ov.env_map()
    for entry in load_specs(path):
        if entry.config is None:
            items.append(Item(entry.id, None, entry.error, entry.error_code))
            continue
        try:
            items.append(Item(entry.id, _with(entry.config, extra, env)))
        except ConfigError as exc:
            items.append(Item(entry.id, None, f"{entry.where}: {exc.message}", exc.code))
    return items


def from_commands_file(path: Path, ov: Overrides) -> list[Item]:
    """Every line of a commands file (JSON lines with ``id``, ``env``, ``argv``, as
    policies/reference/vllm_recipes.jsonl); a line that cannot be parsed gets ``error``."""
    try:
        lines = read_lines(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}",
                          code=ErrorCode.FILE_NOT_FOUND) from None
    items = []
    for n, line in enumerate(lines, start=1):
        if isinstance(line, Issue):
            items.append(Item(None, None, f"{path}:{n}:{line.column}: {line.message}",
                              ErrorCode.BAD_SPEC))
            continue
        if not line.strip():
            continue
        row: Any = None
        try:
            row = json.loads(line)
            argv, env = _command_row(row)
        except ValueError as exc:
            rid = str(row["id"]) if isinstance(row, dict) and _is_id(row.get("id")) else None
            items.append(Item(rid, None, f"{path}:{n}: {exc}", ErrorCode.BAD_SPEC))
            continue
        rid = str(row["id"]) if "id" in row else f"{path.name}:{n}"
        line_ov = Overrides(ov.architecture, ov.hf_config, ov.platform, ov.deployment_id or rid,
                            tuple(f"{k}={v}" for k, v in env.items()) + ov.env, ov.sets)
        item = from_command_line(argv, line_ov)
        items.append(Item(rid, item.config, item.error, item.error_code,
                          item.model or _model_of(argv)))
    return items


def _is_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _command_row(row: Any) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a commands-file line; ValueError saying what is wrong with it."""
    if not isinstance(row, dict) or not isinstance(row.get("argv"), list):
        raise ValueError("expected an object with an argv list")
    if "id" in row and not _is_id(row["id"]):
        raise ValueError(f"id: expected a string, got {row['id']!r}")
    argv, env = row["argv"], row.get("env") or {}
    odd = [a for a in argv if not isinstance(a, str)]
    if odd:
        raise ValueError(f"argv: expected strings, got {odd[0]!r}")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"env: expected an object of NAME: string value, got {env!r}")
    return argv, env


def _model_of(argv: list[Any]) -> str | None:
    return str(argv[2]) if len(argv) > 2 and not str(argv[2]).startswith("-") else None
