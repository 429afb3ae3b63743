"""Parse a real ``vllm serve MODEL [flags]`` command line and its environment, as vLLM does.

The line goes through the release's own ``vllm serve`` parser, rebuilt from
``policies/reference/vllm-<release>/flags.json`` (:mod:`oracle.sources.command_parser`): the
forms vLLM reads (``--flag value``, ``--flag=value``, ``-tp 8``, prefix abbreviations such as
``--tensor-parallel 8``, ``--tensor_parallel_size``, ``--no-enable-prefix-caching``, dotted
``--speculative-config.method mtp`` and ``-cc.pass_config.x=true``, JSON values, ``-O3``,
``--config file.yaml``) are read as it reads them, and a line its parser refuses is refused
with its words (``argument --tensor-parallel-size/-tp: invalid int value: 'two'``,
``unrecognized arguments: --not-a-flag``; unknown keys in ``--compilation-config`` and the other
config-valued flags). Every flag of the release is accepted; those that feed the decision are
mapped (:mod:`oracle.sources.command_fields`), the others are listed in
``ParsedCommand.ignored``. Placeholders (``<X>``, ``$MODEL``, ``${X}``, ``/path/to/...``,
``...``) are refused with an error that says what to pass.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from turnout.oracle.config import DeploymentConfig
from turnout.oracle.errors import ConfigError, ErrorCode, PackError
from turnout.oracle.sources.command_fields import SPECULATIVE_DESTS, speculative, to_fields
from turnout.oracle.sources.command_parser import ParseRefusal, PlaceholderValue, serve_parser
from turnout.oracle.sources.hf_config import hf_config_to_fields
from turnout.oracle.sources.hub import ModelConfigSource, resolve_model_config

_PLACEHOLDER = re.compile(r"^<[^>]*>$|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|^(/)?path/to/|^\.\.\.$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# A bare word ending in punctuation: a sentence's word taken for a model ("vllm serve command.").
_PROSE = re.compile(r"^[A-Za-z]+[.,;:!?]$")
# argparse's "argument --x/-y: ..." and "unrecognized arguments: --x ..." name the flag
_FLAG_IN_MESSAGE = re.compile(
    r"^argument ([^/: ]+)|^unrecognized arguments: (\S+)|"
    r"^ambiguous option: (\S+)"
)
HintFor = Literal["python", "cli", "api", "page"]
ARCHITECTURE_HINTS: dict[str, str] = {
    "python": "pass architecture=ARCH or hf_config=path/to/config.json",
    "cli": "pass --architecture ARCH or --config path/to/config.json",
    "api": 'send {"config": {"architecture": ARCH, ...}} instead of the command',
    "page": "",  # a form that takes only a command line
}
#: Words after ``vllm serve`` read at most: argparse's time grows with the square of a line's
#: length, and real lines have a few dozen.
MAX_WORDS = 1024
RUNNER_ENV_SUFFIX = "_USE_V2_MODEL_RUNNER"
ROCM_ENV_PREFIXES = ("VLLM_ROCM_", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def is_placeholder(token: str) -> bool:
    """True for template text that is not a value: <X>, $X, ${X}, /path/to/..., ..."""
    return bool(_PLACEHOLDER.search(token))


@dataclass
class ParsedCommand:
    """The result of parsing: DeploymentConfig fields, the model, what was knowingly ignored
    (flags of the release that do not change the decision, and environment variables), and
    the vLLM release whose parser read the line."""

    fields: dict[str, Any]
    model: str | None
    ignored: list[str] = field(default_factory=list)
    ignored_env: list[str] = field(default_factory=list)
    release: str = ""
    model_source: ModelConfigSource | None = None  # where the model's facts came from


def _split_argv(argv: Sequence[str] | str, env: dict[str, str]) -> list[str]:
    tokens = shlex.split(argv) if isinstance(argv, str) else list(argv)
    while tokens and _ENV_ASSIGN.match(tokens[0]):  # "VAR=1 vllm serve ..."
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if len(tokens) < 2 or Path(tokens[0]).name != "vllm" or tokens[1] != "serve":
        raise ConfigError(
            f"not a `vllm serve` command line: {' '.join(tokens[:3])!r}...",
            code=ErrorCode.BAD_COMMAND,
        )
    return tokens[2:]


def _check_template(words: list[str]) -> None:
    """Template lines are refused before parsing, with what to pass instead."""
    if "..." in words:
        raise ConfigError(
            "the command line is elided ('...'): pass the complete command",
            code=ErrorCode.PLACEHOLDER_MODEL,
        )
    for i, word in enumerate(words):
        path = words[i + 1] if word == "--config" and i + 1 < len(words) else None
        if path is not None and is_placeholder(path):
            raise ConfigError(
                f"--config {path}: a placeholder, not a file; pass the real path "
                "of the YAML config",
                code=ErrorCode.PLACEHOLDER_MODEL,
                field="--config",
            )


def _loader(base: Path | None, local_files: bool = True) -> Any:
    """Reads a ``--config`` file as vLLM does (``yaml.safe_load``: a duplicated key keeps its
    last value); a file it cannot read is an error that says where. ``local_files=False``
    refuses to read any (the service), saying nothing of the file."""
    from turnout.oracle.yamlpos import YamlTooLargeError, read_text, safe_load_bounded

    def load(path: str) -> Any:
        if not local_files:
            raise ConfigError(
                "--config names a file: the service reads no file a request "
                "names; put the file's settings on the command line",
                code=ErrorCode.LOCAL_FILE,
                field="--config",
            )
        p = Path(path) if base is None else base / path
        try:
            _check_config_file(p, path)
            text = read_text(p, path)
        except OSError as exc:
            raise ConfigError(
                f"--config {path}: cannot read ({exc.strerror or exc})",
                code=ErrorCode.FILE_NOT_FOUND,
                field="--config",
            ) from None
        except PackError as exc:
            raise ConfigError(
                f"--config {exc.issues[0]}", code=ErrorCode.BAD_FLAG_VALUE, field="--config"
            ) from None
        try:
            return safe_load_bounded(text)
        except YamlTooLargeError as exc:
            raise ConfigError(
                f"--config {path}: {exc}", code=ErrorCode.BAD_FLAG_VALUE, field="--config"
            ) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
            raise ConfigError(
                f"--config {path}:{where}: YAML syntax: {exc.problem or exc}",
                code=ErrorCode.BAD_FLAG_VALUE,
                field="--config",
            ) from None

    return load


#: The largest ``--config`` file read (vLLM's own are a few kilobytes).
MAX_CONFIG_FILE_BYTES = 1 << 20


def _check_config_file(p: Path, path: str) -> None:
    """A ``--config`` path that is a device, a FIFO or a huge file would be read forever or
    whole into memory: refuse it first. Raises OSError for a path that does not exist."""
    if not p.exists():
        raise FileNotFoundError(2, "No such file or directory")
    if not p.is_file():
        raise ConfigError(
            f"--config {path}: not a regular file", code=ErrorCode.BAD_FLAG_VALUE, field="--config"
        )
    if p.stat().st_size > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(
            f"--config {path}: {p.stat().st_size:,} bytes; at most "
            f"{MAX_CONFIG_FILE_BYTES:,} are read",
            code=ErrorCode.BAD_FLAG_VALUE,
            field="--config",
        )


def _condense(message: str) -> str:
    """A pydantic refusal on one line: its location joined to its message, the links and
    ``[type=...]`` details dropped."""
    lines = [
        ln.strip()
        for ln in message.splitlines()
        if ln.strip() and not ln.strip().startswith("For further information")
    ]
    lines = [re.sub(r" \[type=.*\]$", "", ln) for ln in lines]
    out: list[str] = []
    for ln in lines:
        if (
            out
            and not out[-1].endswith(":")
            and "validation error" not in out[-1]
            and re.fullmatch(r"[\w.\-\[\]]+", out[-1])
        ):
            out[-1] = f"{out[-1]}: {ln}"
        else:
            out.append(ln)
    return "; ".join(out)


def parse_serve_words(
    words: list[str],
    *,
    release: str | None = None,
    base_dir: Path | None = None,
    local_files: bool = True,
) -> dict[str, Any]:
    """dest -> value for the flags of ``words`` (after ``vllm serve``), parsed by the
    release's ``vllm serve`` parser (None: the newest table). Raises ConfigError:
    ``unknown_flag`` (a flag the release does not have, an ambiguous prefix, ``--omni``),
    ``bad_flag_value`` (a value its type, choices or config class refuses, a switch given a
    value, a missing value), ``placeholder_value`` (a template placeholder its type refuses)."""
    parser = serve_parser(release)
    version = parser.table.vllm_version
    try:
        return parser.parse(words, _loader(base_dir, local_files))
    except PlaceholderValue as exc:
        raise ConfigError(
            f"argument {exc.shown}: {exc.value!r} is a placeholder, not a value; "
            "pass the real value",
            code=ErrorCode.PLACEHOLDER_VALUE,
            field=exc.flag,
        ) from None
    except ParseRefusal as exc:
        found = _FLAG_IN_MESSAGE.match(exc.message)
        flag = next((g for g in found.groups() if g), None) if found else None
        code = ErrorCode.UNKNOWN_FLAG if exc.unknown else ErrorCode.BAD_FLAG_VALUE
        text = f"{_condense(exc.message)} (the vllm serve parser of vLLM {version})"
        if exc.unknown and flag is not None and not flag.startswith("-"):
            code, text = ErrorCode.BAD_COMMAND, _extra_positional(words, flag, text)
        raise ConfigError(text, code=code, field=flag) from None


def _extra_positional(words: list[str], extra: str, text: str) -> str:
    """An unrecognized word that is no flag: a second model, or a stray word."""
    model = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--model"), None)
    model = model or next(
        (w.removeprefix("--model=") for w in words if w.startswith("--model=")), None
    )
    if model is not None:
        return f"the model is given twice: {extra!r} and --model {model!r}; {text}"
    return f"unexpected extra argument {extra!r} after the model; {text}"


def check_line(
    argv: Sequence[str] | str, *, release: str | None = None, base_dir: str | Path | None = None
) -> tuple[dict[str, Any] | None, ConfigError | None]:
    """What vLLM ``release``'s ``vllm serve`` would make of a line: its parser, then the
    engine's start-up check of ``--speculative-config``; nothing about the model.
    ``(flags given: dest -> value, None)`` when it accepts the line, ``(None, error)`` when
    not. The referee compares this verdict with the release's own (``python -m referee
    flags-check``)."""
    try:
        words = _split_argv(argv, {})
        base = Path(base_dir) if base_dir is not None else None
        given = parse_serve_words(words, release=release, base_dir=base)
        if any(given.get(d) is not None for d in SPECULATIVE_DESTS):
            speculative(given, serve_parser(release).table)
    except ConfigError as exc:
        return None, exc
    return given, None


def command_to_fields(
    argv: Sequence[str] | str,
    env: Mapping[str, str],
    *,
    architecture: str | None = None,
    hf_config: str | Path | None = None,
    base_dir: str | Path | None = None,
    hint_for: HintFor = "python",
    release: str | None = None,
    offline: bool = False,
    local_files: bool = True,
) -> ParsedCommand:
    """Parse ``argv`` (with ``env``) into DeploymentConfig fields with the ``vllm serve``
    parser of vLLM ``release`` ("0.31"; None: the newest table). See the module docstring.

    The model's facts come from :func:`oracle.sources.hub.resolve_model_config` (a local
    directory, the HF cache, the hub at ``--revision``, known_models.yaml; ``--hf-config-path``
    names the config instead of the model; ``offline`` never asks the hub), recorded in
    ``ParsedCommand.model_source``.

    Raises ConfigError naming the offending flag, value or model; for a model whose
    architecture is unknown, the message says how to give it in the words of ``hint_for``
    (``"python"``: ``architecture=``/``hf_config=``; ``"cli"``: ``--architecture``/``--config``;
    ``"api"``: a ``config`` body; ``"page"``: the command alone), ``--hf-overrides`` in each.
    ``local_files=False`` (the service) refuses ``--config``, ``--hf-config-path`` and a
    model given as a local path with ``local_file``: a request must not read the server's files.
    """
    try:
        return _command_to_fields(
            argv, env, architecture, hf_config, base_dir, hint_for, release, offline, local_files
        )
    except RecursionError:  # json.loads of a value (or a config.json) nested ~1,000 deep
        raise ConfigError(
            "a JSON value of the command line (or the model's config.json) is "
            "nested too deeply to read",
            code=ErrorCode.BAD_FLAG_VALUE,
        ) from None


def _command_to_fields(
    argv: Sequence[str] | str,
    env: Mapping[str, str],
    architecture: str | None,
    hf_config: str | Path | None,
    base_dir: str | Path | None,
    hint_for: HintFor,
    release: str | None,
    offline: bool,
    local_files: bool,
) -> ParsedCommand:
    env_all = dict(env)
    words = _split_argv(argv, env_all)
    _check_template(words)
    base = Path(base_dir) if base_dir is not None else None
    if len(words) > MAX_WORDS:
        raise ConfigError(
            f"the command line has {len(words)} words; at most {MAX_WORDS} are "
            "read (a real vllm serve line has a few dozen)",
            code=ErrorCode.BAD_COMMAND,
        )
    given = parse_serve_words(words, release=release, base_dir=base, local_files=local_files)
    table = serve_parser(release).table
    fields, ignored = to_fields(given, table)
    model = given.get("model_tag")
    runner_env = {k: v for k, v in env_all.items() if k.endswith(RUNNER_ENV_SUFFIX)}
    if runner_env:
        fields["env"] = runner_env
    backend = str(fields.pop("_attention_backend", "")).upper()
    if backend.startswith("ROCM") or any(k.startswith(ROCM_ENV_PREFIXES) for k in env_all):
        fields.setdefault("platform", "rocm")  # AMD-only variables or attention backends
    draft = fields.pop("_draft_model", None)
    model_fields, source = _model_fields(
        model, fields, architecture, hf_config, base, hint_for, offline, local_files
    )
    fields.update(model_fields)
    if draft is not None:
        draft_fields = _draft_fields(draft, base, offline, local_files)
        if not draft_fields:
            ignored.append("--speculative-config.model")
        fields.update(draft_fields)
    if model is not None:
        fields["model"] = model
    return ParsedCommand(
        fields,
        model,
        ignored,
        sorted(k for k in env_all if k not in runner_env),
        table.release,
        source,
    )


def from_command(
    argv: Sequence[str] | str,
    env: Mapping[str, str] | None = None,
    *,
    architecture: str | None = None,
    hf_config: str | Path | None = None,
    base_dir: str | Path | None = None,
    hint_for: HintFor = "python",
    release: str | None = None,
    offline: bool = False,
    local_files: bool = True,
    **overrides: Any,
) -> DeploymentConfig:
    """A DeploymentConfig from a real ``vllm serve MODEL [flags]`` command line and its
    environment.

    The line is read by the ``vllm serve`` parser of vLLM ``release`` ("0.29" ... "0.33";
    None: the newest; :func:`oracle.sources.command_table.release_for_pack` gives a pack's).
    ``argv`` is a list (or a shell string, split with shlex). Unless ``architecture`` or
    ``hf_config`` is given, the model's config.json is read from a local directory, the HF
    cache or the hub (at ``--revision``; never the hub with ``offline`` or HF_HUB_OFFLINE=1),
    else its ``policies/known_models.yaml`` entry is used (oracle/sources/hub.py);
    ``overrides`` (DeploymentConfig fields) win. Raises ConfigError for a placeholder model, an
    unknown or gated model, a revision the hub does not have, a flag or a value the release's
    parser refuses (the message names it, in the parser's words), a local file named where
    ``local_files`` is False; ``hint_for`` ("python", "cli", "api", "page") words how to
    give an architecture the oracle cannot find, and an unknown model's message names the
    architectures its name suggests.
    """
    fields = command_to_fields(
        argv,
        env or {},
        architecture=architecture,
        hf_config=hf_config,
        base_dir=base_dir,
        hint_for=hint_for,
        release=release,
        offline=offline,
        local_files=local_files,
    ).fields
    fields.update(overrides)
    return DeploymentConfig(**fields)


def architecture_hint(hint_for: HintFor) -> str:
    """How to give a deployment's architecture, in the words of whoever reads the error."""
    try:
        own = ARCHITECTURE_HINTS[hint_for]
    except KeyError:
        raise ValueError(
            f"hint_for: expected one of {', '.join(ARCHITECTURE_HINTS)}, got {hint_for!r}"
        ) from None
    overrides = 'add --hf-overrides \'{"architectures": ["ARCH"]}\' to the command'
    return f"{own}, or {overrides}" if own else overrides


def _model_fields(
    model: str | None,
    fields: dict[str, Any],
    architecture: str | None,
    hf_config: str | Path | None,
    base: Path | None,
    hint_for: HintFor,
    offline: bool,
    local_files: bool = True,
) -> tuple[dict[str, Any], ModelConfigSource | None]:
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
        raise ConfigError(
            f"the model {model!r} is a placeholder, not a model id; {hint}",
            code=ErrorCode.PLACEHOLDER_MODEL,
            field="model",
        )
    if _PROSE.match(model):
        raise ConfigError(
            f"the model {model!r} is a word of prose (a bare word ending in "
            "punctuation), not a model id: the line reads as a sentence about a "
            "command, not a command; give a real vllm serve MODEL line",
            code=ErrorCode.PLACEHOLDER_MODEL,
            field="model",
        )
    if config_path and not local_files:
        raise ConfigError(
            "--hf-config-path names a file: the service reads no file a request "
            "names; give the architecture in a config instead",
            code=ErrorCode.LOCAL_FILE,
            field="--hf-config-path",
        )
    source = resolve_model_config(
        config_path or model,
        revision,
        base_dir=base,
        offline=offline,
        hint=hint,
        local_files=local_files,
        what="--hf-config-path" if config_path else "model",
    )
    return source.fields() | _explicit(fields), source


def _draft_fields(
    draft: str, base: Path | None, offline: bool, local_files: bool
) -> dict[str, Any]:
    """The draft model's facts from its config.json, found the way the target's is (vLLM
    builds the draft's ModelConfig the same way: SpeculativeConfig.__post_init__):
    ``draft_architecture`` (its ``architectures[0]``, before EAGLEConfig renames it),
    ``draft_vocab_size`` and ``draft_is_moe``. Empty when it cannot be read (the line is then decided without
    them, and the draft is listed as ignored)."""
    try:
        source = resolve_model_config(
            draft,
            base_dir=base,
            offline=offline,
            what="--speculative-config.model",
            local_files=local_files,
        )
        facts = source.fields()
    except ConfigError:
        return {}
    out: dict[str, Any] = {}
    if isinstance(facts.get("architecture"), str):
        out["draft_architecture"] = facts["architecture"]
    if isinstance(facts.get("vocab_size"), int):
        out["draft_vocab_size"] = facts["vocab_size"]
    if out:  # a config.json without expert counts is a dense model's
        out["draft_is_moe"] = bool(facts.get("is_moe"))
    return out


def _explicit(fields: dict[str, Any]) -> dict[str, Any]:
    """Command-line values win over facts from known_models.yaml or a config.json."""
    return {k: fields[k] for k in ("quantization",) if k in fields}
