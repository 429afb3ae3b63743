"""Turn the CLI's inputs (a command line, a spec file, a commands file, keyword options) into
a list of deployments to decide, each with its id, its config or the error that rejected it."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from turnout.oracle import bounded_json
from turnout.oracle.config import DeploymentConfig
from turnout.oracle.errors import ConfigError, ErrorCode, Issue
from turnout.oracle.sources import command_to_fields, from_hf_config, load_specs
from turnout.oracle.wire import CommandsFileLine
from turnout.oracle.yamlpos import read_lines

_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SCALARS = {"true": True, "false": False, "none": None, "null": None}


def parse_json_value(text: str, *, flag: str) -> Any:
    """A ``--set`` value: JSON when it looks like JSON (an invalid one is a ConfigError naming
    ``flag``), else a scalar (``True`` -> true, ``8`` -> 8), else the text."""
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            return bounded_json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{flag}: invalid JSON value ({exc.msg} at column {exc.colno}): {text!r}",
                code=ErrorCode.BAD_VALUE,
                field=flag,
            ) from None
        except bounded_json.TooDeepError as exc:
            raise ConfigError(
                f"{flag}: invalid JSON value ({exc})", code=ErrorCode.BAD_VALUE, field=flag
            ) from None
    if stripped.lower() in _SCALARS:
        return _SCALARS[stripped.lower()]
    for convert in (int, float):
        try:
            return convert(stripped)
        except ValueError:
            pass
    return text


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
    release: str | None = None  # whose `vllm serve` parser reads command lines (None: newest)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.platform:
            out["platform"] = self.platform
        if self.deployment_id:
            out["deployment_id"] = self.deployment_id
        for item in self.sets:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ConfigError(
                    f"--set expects FIELD=VALUE, got {item!r}", code=ErrorCode.BAD_VALUE
                )
            out[key.strip()] = parse_json_value(value, flag=f"--set {key}")
        return out

    def env_map(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.env:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ConfigError(
                    f"--env expects NAME=VALUE, got {item!r}", code=ErrorCode.BAD_VALUE
                )
            out[key] = value
        return out


def _with(
    config: DeploymentConfig, fields: dict[str, Any], env: dict[str, str]
) -> DeploymentConfig:
    if env:
        fields = fields | {"env": {**config.env, **env}}
    return config.replace(**fields) if fields else config


def from_command_line(argv: list[str], ov: Overrides) -> Item:
    """The deployment of one ``vllm serve`` command line."""
    try:
        parsed = command_to_fields(
            argv,
            ov.env_map(),
            architecture=ov.architecture,
            hf_config=ov.hf_config,
            hint_for="cli",
            release=ov.release,
        )
        cfg = DeploymentConfig(**parsed.fields)
        source = parsed.model_source.describe() if parsed.model_source else None
        return Item(
            ov.deployment_id, _with(cfg, ov.fields(), {}), model=cfg.model, model_source=source
        )
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
    """Every deployment of a commands file; a line that cannot be parsed gets ``error``.

    A line is a JSON object with ``id``, ``env`` and ``argv`` (as policies/reference/
    vllm_recipes.jsonl), or a shell line ``[NAME=value ...] vllm serve MODEL [flags]`` (a
    trailing backslash continues it on the next line; ``#`` starts a comment line), whose id
    is ``FILE:LINE``."""
    try:
        lines = read_lines(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc}", code=ErrorCode.FILE_NOT_FOUND
        ) from None
    items = []
    for n, line in _logical_lines(lines):
        if isinstance(line, Issue):
            items.append(
                Item(None, None, f"{path}:{n}:{line.column}: {line.message}", ErrorCode.BAD_SPEC)
            )
            continue
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        row: Any = None
        try:
            if text.startswith("{"):
                row = json.loads(text)
                argv, env = _command_row(row)
            else:
                row, (argv, env) = {}, _shell_row(text)
        except (ValueError, RecursionError) as exc:
            if isinstance(exc, RecursionError):
                exc = ValueError("a JSON value nested too deeply to read")
            rid = (
                str(row["id"])
                if isinstance(row, dict) and _is_id(row.get("id"))
                else (None if text.startswith("{") else f"{path.name}:{n}")
            )
            items.append(Item(rid, None, f"{path}:{n}: {exc}", ErrorCode.BAD_SPEC))
            continue
        rid = str(row["id"]) if "id" in row else f"{path.name}:{n}"
        line_ov = Overrides(
            ov.architecture,
            ov.hf_config,
            ov.platform,
            ov.deployment_id or rid,
            tuple(f"{k}={v}" for k, v in env.items()) + ov.env,
            ov.sets,
            ov.release,
        )
        item = from_command_line(argv, line_ov)
        items.append(
            Item(rid, item.config, item.error, item.error_code, item.model or _model_of(argv))
        )
    return items


def _logical_lines(lines: Iterable[str | Issue]) -> Iterator[tuple[int, str | Issue]]:
    """(first line number, text) of each line, shell lines ending in a backslash joined with
    the lines that continue them."""
    pending: tuple[int, str] | None = None
    for n, line in enumerate(lines, start=1):
        if isinstance(line, Issue):
            if pending is not None:
                yield pending
                pending = None
            yield n, line
            continue
        start, text = (pending[0], f"{pending[1]} {line.strip()}") if pending else (n, line)
        pending = None
        if not text.lstrip().startswith("{") and text.rstrip().endswith("\\"):
            pending = (start, text.rstrip()[:-1])
            continue
        yield start, text
    if pending is not None:
        yield pending


def _shell_row(text: str) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a shell line: leading ``NAME=value`` words are the environment."""
    try:
        words = shlex.split(text)
    except ValueError as exc:  # an unbalanced quote
        raise ValueError(f"not a shell command line ({exc})") from None
    env: dict[str, str] = {}
    while words and _ENV_WORD.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise ValueError("no command after the environment assignments")
    return words, env


def _is_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _command_row(row: Any) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a commands-file line (``oracle.wire.CommandsFileLine`` with ``argv``);
    ValueError saying what is wrong with it."""
    if not isinstance(row, dict):
        raise ValueError("expected an object with an argv list")
    try:
        line = CommandsFileLine.model_validate(row)
    except ValidationError as exc:
        raise ValueError(_first_error(exc)) from None
    if line.argv is None:
        raise ValueError(
            "expected an argv list (a `command` or `config` line belongs to "
            "POST /api/v1/decide; here give argv, or the command as a shell line)"
        )
    return line.argv, line.env


def _first_error(exc: ValidationError) -> str:
    """``FIELD: what is wrong (at FIELD[3])`` of the first error (the field first, as people
    scan for it)."""
    err = exc.errors(include_url=False)[0]
    loc = [p for p in err["loc"] if p not in ("str", "int")]  # the union's member tags
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not loc:
        return msg
    deeper = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
    return f"{loc[0]}: {msg}" + (f" (at {loc[0]}{deeper})" if deeper else "")


def _model_of(argv: list[Any]) -> str | None:
    return str(argv[2]) if len(argv) > 2 and not str(argv[2]).startswith("-") else None
