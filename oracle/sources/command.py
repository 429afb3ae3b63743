"""Parse a real ``vllm serve MODEL [flags]`` command line and its environment.

Forms handled (all seen in policies/reference/vllm_recipes.jsonl): ``--flag value``,
``--flag=value``, short aliases (``-tp 8``), underscore spellings (``--tensor_parallel_size``),
negated switches (``--no-enable-prefix-caching``), dotted sub-keys of JSON-valued flags
(``--speculative-config.method mtp``, ``-cc.pass_config.x=True``), JSON values, ``-O3``,
``--config file.yaml`` (vLLM's own config file; command-line flags win over it).
Placeholders (``<X>``, ``$MODEL``, ``${X}``, ``/path/to/...``, ``...``) are refused with an error
that says what to pass. Flags that cannot change the decision are accepted knowingly
(:data:`oracle.sources.command_flags.IGNORED_FLAGS`) and reported in ``ParsedCommand.ignored``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from oracle.config import DeploymentConfig
from oracle.errors import ConfigError, ErrorCode, PackError
from oracle.sources.command_flags import DECISION_FLAGS, IGNORED_FLAGS, FlagSpec
from oracle.sources.command_values import apply_json_flags, parse_json_value
from oracle.sources.hf_config import hf_config_to_fields
from oracle.sources.hub import ModelConfigSource, resolve_model_config

_BY_NAME: dict[str, FlagSpec] = {}
for _spec in DECISION_FLAGS:
    for _n in (_spec.name, *_spec.aliases):
        _BY_NAME[_n] = _spec
_PLACEHOLDER = re.compile(r"^<[^>]*>$|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|^(/)?path/to/|^\.\.\.$")
_VALUE_PLACEHOLDER = re.compile(r"<[^<>\s]+>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|^(/)?path/to/")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# A bare word ending in punctuation: a sentence's word taken for a model ("vllm serve command.").
_PROSE = re.compile(r"^[A-Za-z]+[.,;:!?]$")
HintFor = Literal["python", "cli", "api", "page"]
ARCHITECTURE_HINTS: dict[str, str] = {
    "python": "pass architecture=ARCH or hf_config=path/to/config.json",
    "cli": "pass --architecture ARCH or --config path/to/config.json",
    "api": 'send {"config": {"architecture": ARCH, ...}} instead of the command',
    "page": "",  # a form that takes only a command line
}
RUNNER_ENV_SUFFIX = "_USE_V2_MODEL_RUNNER"
ROCM_ENV_PREFIXES = ("VLLM_ROCM_", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def is_placeholder(token: str) -> bool:
    """True for template text that is not a value: <X>, $X, ${X}, /path/to/..., ..."""
    return bool(_PLACEHOLDER.search(token))


@dataclass
class ParsedCommand:
    """The result of parsing: DeploymentConfig fields, the model, what was knowingly ignored."""

    fields: dict[str, Any]
    model: str | None
    ignored: list[str] = field(default_factory=list)
    ignored_env: list[str] = field(default_factory=list)
    model_source: ModelConfigSource | None = None  # where the model's facts came from


@dataclass
class _State:
    fields: dict[str, Any] = field(default_factory=dict)
    json_flags: dict[str, dict[str, Any]] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    config_files: list[str] = field(default_factory=list)


def _norm(name: str) -> str:
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("_", "-")


def _split_argv(argv: Sequence[str] | str, env: dict[str, str]) -> list[str]:
    tokens = shlex.split(argv) if isinstance(argv, str) else list(argv)
    while tokens and _ENV_ASSIGN.match(tokens[0]):  # "VAR=1 vllm serve ..."
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if len(tokens) < 2 or Path(tokens[0]).name != "vllm" or tokens[1] != "serve":
        raise ConfigError(f"not a `vllm serve` command line: {' '.join(tokens[:3])!r}...",
                          code=ErrorCode.BAD_COMMAND)
    return tokens[2:]


def _take_values(spec_nargs: int | str, name: str, inline: str | None, rest: list[str],
                 i: int) -> tuple[list[str], int]:
    if inline is not None:
        return [inline], i
    if spec_nargs == "+":
        values: list[str] = []
        while i < len(rest) and not (rest[i].startswith("-") and len(rest[i]) > 1):
            values.append(rest[i])
            i += 1
        if not values:
            raise ConfigError(f"{name} needs at least one value", code=ErrorCode.BAD_FLAG_VALUE,
                              field=name)
        return values, i
    if i >= len(rest) or (rest[i].startswith("--") and rest[i] != "--"):
        raise ConfigError(f"{name} needs a value", code=ErrorCode.BAD_FLAG_VALUE, field=name)
    return [rest[i]], i + 1


def _parse_tokens(rest: list[str], st: _State) -> None:
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if tok == "...":
            raise ConfigError("the command line is elided ('...'): pass the complete command",
                              code=ErrorCode.PLACEHOLDER_MODEL)
        if not tok.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", tok):
            st.positional.append(tok)
            continue
        if re.fullmatch(r"-O\d", tok) or re.fullmatch(r"-O\.[\w.]+(=.*)?", tok):
            st.ignored.append(tok)  # optimization level: compilation defaults, not the mode
            continue
        raw_name, eq, inline_value = tok.partition("=")
        base, _, sub = raw_name.partition(".") if not raw_name.startswith("-O") else (raw_name,
                                                                                    "", "")
        name = _norm(base)
        inline = inline_value if eq else None
        i = _dispatch(name, sub, inline, rest, i, st, tok)


def _dispatch(name: str, sub: str, inline: str | None, rest: list[str], i: int, st: _State,
              tok: str) -> int:
    spec = _BY_NAME.get(name)
    negated = False
    if spec is None and name.startswith("--no-"):
        cand = _BY_NAME.get("--" + name[5:])
        if cand is not None and cand.nargs == 0:
            spec, negated = cand, True
        elif IGNORED_FLAGS.get("--" + name[5:]) == 0:
            st.ignored.append(tok)
            return i
    if spec is None:
        nargs = IGNORED_FLAGS.get(name)
        if nargs is None:
            raise ConfigError(f"unknown flag {tok.split('=')[0]!r}: not a vllm serve flag the "
                              "oracle knows (docs/oracle-api.md lists the ignored ones)",
                              code=ErrorCode.UNKNOWN_FLAG, field=tok.split("=")[0])
        if nargs == 0:
            values: list[str] = []
        else:
            values, i = _take_values(1 if sub else nargs, name, inline, rest, i)
        st.ignored.append(" ".join([tok.split("=")[0], *values]))
        return i
    if spec.nargs == 0:
        if inline is not None or sub:
            raise ConfigError(f"{name} is a switch and takes no value (got {tok!r})",
                              code=ErrorCode.BAD_FLAG_VALUE, field=name)
        st.fields[spec.field or name] = not negated
        return i
    values, i = _take_values(spec.nargs, name, inline, rest, i)
    for v in values:
        if _VALUE_PLACEHOLDER.search(v) and spec.name not in ("--model", "--config"):
            raise ConfigError(f"{name} {v!r}: a placeholder, not a value; pass the real value",
                              code=ErrorCode.PLACEHOLDER_VALUE, field=name)
    if sub:
        if len(values) != 1:
            raise ConfigError(f"{tok}: expected one value", code=ErrorCode.BAD_FLAG_VALUE,
                              field=name)
        _set_nested(st.json_flags.setdefault(spec.name, {}), sub.split("."),
                    parse_json_value(values[0], strict=False))
        return i
    if spec.name == "--config":
        st.config_files.append(values[0])
    elif spec.field is not None:
        st.fields[spec.field] = values if spec.nargs == "+" else values[0]
    else:
        st.json_flags.setdefault(spec.name, {}).update(_json_object(spec.name, values[0]))
    return i


def _json_object(name: str, value: str) -> dict[str, Any]:
    parsed = parse_json_value(value, strict=True, flag=name)
    if isinstance(parsed, dict):
        return parsed
    return {"": parsed}  # a bare value (e.g. --compilation-config 3, --runner pooling)


def _set_nested(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        nxt = target.setdefault(key, {})
        if not isinstance(nxt, dict):
            nxt = target[key] = {}
        target = nxt
    target[keys[-1]] = value


def _config_file_tokens(path: str, base_dir: Path | None) -> list[str]:
    from oracle.yamlpos import load_text_with_positions, read_text

    if is_placeholder(path):
        raise ConfigError(f"--config {path}: a placeholder, not a file; pass the real path of "
                          "the YAML config", code=ErrorCode.PLACEHOLDER_MODEL, field="--config")
    p = Path(path) if base_dir is None else base_dir / path
    try:
        data, _ = load_text_with_positions(read_text(p), str(p))
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read ({exc.strerror or exc})",
                          code=ErrorCode.FILE_NOT_FOUND, field="--config") from None
    except PackError as exc:
        raise ConfigError(f"--config {exc.issues[0]}", code=ErrorCode.BAD_FLAG_VALUE,
                          field="--config") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values",
                          code=ErrorCode.BAD_FLAG_VALUE, field="--config")
    tokens: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            tokens.append(flag)
        elif value is False:
            tokens.append("--no-" + flag[2:])
        elif isinstance(value, list):
            tokens += [flag, *map(str, value)]
        else:
            tokens += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return tokens


def command_to_fields(argv: Sequence[str] | str, env: Mapping[str, str], *,
                      architecture: str | None = None, hf_config: str | Path | None = None,
                      base_dir: str | Path | None = None, hint_for: HintFor = "python",
                      offline: bool = False) -> ParsedCommand:
    """Parse ``argv`` (with ``env``) into DeploymentConfig fields. See the module docstring.

    The model's facts come from :func:`oracle.sources.hub.resolve_model_config` (a local
    directory, the HF cache, the hub at ``--revision``, known_models.yaml; ``--hf-config-path``
    names the config instead of the model; ``offline`` never asks the hub), recorded in
    ``ParsedCommand.model_source``.

    Raises ConfigError naming the offending flag, value or model; for a model whose
    architecture is unknown, the message says how to give it in the words of ``hint_for``
    (``"python"``: ``architecture=``/``hf_config=``; ``"cli"``: ``--architecture``/``--config``;
    ``"api"``: a ``config`` body; ``"page"``: the command alone), ``--hf-overrides`` in each.
    """
    env_all = dict(env)
    rest = _split_argv(argv, env_all)
    base = Path(base_dir) if base_dir is not None else None
    st = _State()
    _parse_tokens(rest, st)
    cli = st
    if cli.config_files:
        st = _State()
        for path in cli.config_files:
            _parse_tokens(_config_file_tokens(path, base), st)
        _parse_tokens(rest, st)  # command-line flags win over the config file
        st.config_files = cli.config_files
    fields = st.fields
    model = _model(st)
    apply_json_flags(st.json_flags, fields, st.ignored)
    runner_env = {k: v for k, v in env_all.items() if k.endswith(RUNNER_ENV_SUFFIX)}
    if runner_env:
        fields["env"] = runner_env
    backend = str(fields.pop("_attention_backend", "")).upper()
    if backend.startswith("ROCM") or any(k.startswith(ROCM_ENV_PREFIXES) for k in env_all):
        fields.setdefault("platform", "rocm")  # AMD-only variables or attention backends
    model_fields, source = _model_fields(model, fields, architecture, hf_config, base, hint_for,
                                         offline)
    fields.update(model_fields)
    if model is not None:
        fields["model"] = model
    return ParsedCommand(fields, model, st.ignored,
                         sorted(k for k in env_all if k not in runner_env), source)


def from_command(argv: Sequence[str] | str, env: Mapping[str, str] | None = None, *,
                 architecture: str | None = None, hf_config: str | Path | None = None,
                 base_dir: str | Path | None = None, hint_for: HintFor = "python",
                 offline: bool = False, **overrides: Any) -> DeploymentConfig:
    """A DeploymentConfig from a real ``vllm serve MODEL [flags]`` command line and its
    environment.

    ``argv`` is a list (or a shell string, split with shlex). Unless ``architecture`` or
    ``hf_config`` is given, the model's config.json is read from a local directory, the HF
    cache or the hub (at ``--revision``; never the hub with ``offline`` or HF_HUB_OFFLINE=1),
    else its ``policies/known_models.yaml`` entry is used (oracle/sources/hub.py);
    ``overrides`` (DeploymentConfig fields) win. Raises ConfigError for a placeholder model, an
    unknown or gated model, a revision the hub does not have, an unknown flag or a bad flag
    value (the message names it); ``hint_for`` ("python", "cli", "api", "page") words how to
    give an architecture the oracle cannot find, and an unknown model's message names the
    architectures its name suggests.
    """
    fields = command_to_fields(argv, env or {}, architecture=architecture, hf_config=hf_config,
                               base_dir=base_dir, hint_for=hint_for, offline=offline).fields
    fields.update(overrides)
    return DeploymentConfig(**fields)


def _model(st: _State) -> str | None:
    model = st.fields.pop("model", None)
    if st.positional:
        if model is not None:
            raise ConfigError(f"the model is given twice: {st.positional[0]!r} and --model "
                              f"{model!r}", code=ErrorCode.BAD_COMMAND)
        model = st.positional[0]
        if len(st.positional) > 1:
            raise ConfigError(f"unexpected extra argument {st.positional[1]!r} after the model "
                              f"{model!r}", code=ErrorCode.BAD_COMMAND)
    return model  # type: ignore[no-any-return]


def architecture_hint(hint_for: HintFor) -> str:
    """How to give a deployment's architecture, in the words of whoever reads the error."""
    try:
        own = ARCHITECTURE_HINTS[hint_for]
    except KeyError:
        raise ValueError(f"hint_for: expected one of {', '.join(ARCHITECTURE_HINTS)}, got "
                         f"{hint_for!r}") from None
    overrides = "add --hf-overrides '{\"architectures\": [\"ARCH\"]}' to the command"
    return f"{own}, or {overrides}" if own else overrides


def _model_fields(model: str | None, fields: dict[str, Any], architecture: str | None,
                  hf_config: str | Path | None, base: Path | None, hint_for: HintFor,
                  offline: bool) -> tuple[dict[str, Any], ModelConfigSource | None]:
    revision = fields.pop("_revision", None)
    config_path = fields.pop("_hf_config_path", None)
    if hf_config is not None:
        return hf_config_to_fields(hf_config) | _explicit(fields), None
    if architecture is not None:
        return {"architecture": architecture}, None
    if "architecture" in fields:  # from --hf-overrides architectures
        return {}, None
    hint = architecture_hint(hint_for)
    if model is None:
        raise ConfigError(f"no model in the command line; {hint}", code=ErrorCode.MISSING_MODEL)
    if is_placeholder(model):
        raise ConfigError(f"the model {model!r} is a placeholder, not a model id; {hint}",
                          code=ErrorCode.PLACEHOLDER_MODEL, field="model")
    if _PROSE.match(model):
        raise ConfigError(f"the model {model!r} is a word of prose (a bare word ending in "
                          "punctuation), not a model id: the line reads as a sentence about a "
                          "command, not a command; give a real vllm serve MODEL line",
                          code=ErrorCode.PLACEHOLDER_MODEL, field="model")
    source = resolve_model_config(config_path or model, revision, base_dir=base,
                                  offline=offline, hint=hint,
                                  what="--hf-config-path" if config_path else "model")
    return source.fields() | _explicit(fields), source


def _explicit(fields: dict[str, Any]) -> dict[str, Any]:
    """Command-line values win over facts from known_models.yaml or a config.json."""
    return {k: fields[k] for k in ("quantization",) if k in fields}
