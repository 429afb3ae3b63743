"""What ``turnout launch`` and :func:`oracle.launch.apply_rollout` read: the service settings from
the environment, and the deployment from a ``vllm serve`` command line or from ``vllm.LLM``'s
engine arguments, read by the ``vllm serve`` parser of the installed release."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnout.oracle.config import DeploymentConfig
from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.sources import ParsedCommand, command_to_fields
from turnout.oracle.sources.command_table import load_table
from turnout.oracle.wire import MAX_NAME_CHARS

_ENV_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


@dataclass(frozen=True)
class LaunchSettings:
    """Where the rollout service is and who this deployment is, from the environment:

    - ``TURNOUT_URL``: the service's base URL (unset: no service; the last-known-good copy or
      the pack's defaults decide, and nothing is reported);
    - ``TURNOUT_TOKEN``: a token of the service (operator role, to report decisions);
    - ``TURNOUT_PACK``: the pack the service runs (its rollout; default ``turnout``, as the
      service's own setting);
    - ``TURNOUT_CACHE_DIR``: the last-known-good snapshot and the event spool (default
      ``$XDG_CACHE_HOME/turnout``, else ``~/.cache/turnout``);
    - ``TURNOUT_DEPLOYMENT_ID``: the deployment's stable id, for percentage canaries (default:
      the host name).
    """

    url: str | None
    token: str | None
    pack: str
    cache_dir: Path
    deployment_id: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LaunchSettings:
        env = os.environ if env is None else env
        xdg = env.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path(env.get("HOME") or Path.home()) / ".cache"
        return cls(
            url=env.get("TURNOUT_URL") or None,
            token=env.get("TURNOUT_TOKEN") or None,
            pack=env.get("TURNOUT_PACK") or "turnout",
            cache_dir=Path(env.get("TURNOUT_CACHE_DIR") or base / "turnout"),
            deployment_id=env.get("TURNOUT_DEPLOYMENT_ID") or socket.gethostname(),
        )


def split_assignments(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(the command, the ``NAME=value`` words before it): ``VLLM_USE_V2_MODEL_RUNNER=0 vllm
    serve M`` runs ``vllm serve M`` with that variable, as a shell would."""
    words = list(argv)
    env: dict[str, str] = {}
    while words and (hit := _ENV_ASSIGN.match(words[0])):
        env[hit.group(1)] = hit.group(2)
        words.pop(0)
    return words, env


def config_from_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    release: str,
    deployment_id: str,
    architecture: str | None = None,
    hf_config: str | Path | None = None,
    hint_for: str = "cli",
    overrides: Mapping[str, Any] | None = None,
) -> tuple[DeploymentConfig, ParsedCommand]:
    """The deployment of a ``vllm serve`` line with the environment vLLM gets, read by the
    ``vllm serve`` parser of ``release`` ("0.31"). Raises ConfigError naming the flag, value
    or model the parser refuses, in its words, or a deployment id no event takes."""
    if not 0 < len(deployment_id) <= MAX_NAME_CHARS:  # what an event takes
        raise ConfigError(
            f"the deployment id is {len(deployment_id)} characters long: at "
            f"most {MAX_NAME_CHARS} (TURNOUT_DEPLOYMENT_ID, --deployment-id)",
            code=ErrorCode.BAD_VALUE,
            field="deployment_id",
        )
    parsed = command_to_fields(
        list(argv),
        env,
        architecture=architecture,
        hf_config=hf_config,
        hint_for=hint_for,  # type: ignore[arg-type]
        release=release,
    )
    fields = {**parsed.fields, "deployment_id": deployment_id, **(overrides or {})}
    return DeploymentConfig(**fields), parsed


def engine_args_words(model: str, engine_args: Mapping[str, Any], *, release: str) -> list[str]:
    """``vllm serve MODEL [flags]`` for ``vllm.LLM(model, **engine_args)``: each engine
    argument is the flag whose dest it is in ``release``'s parser (``tensor_parallel_size=2`` →
    ``--tensor-parallel-size 2``; True/False switches → ``--x`` / ``--no-x``; dicts and lists
    of JSON-valued flags → JSON; None → left out). Raises ConfigError (``unknown_flag``) for a
    name that is no engine argument of the release."""
    table = load_table(release)
    words = ["vllm", "serve", model]
    for name, value in engine_args.items():
        action = table.action(name) if name not in ("model_tag", "help") else None
        if action is None or not action["option_strings"]:
            raise ConfigError(
                f"{name!r} is not an engine argument of vLLM "
                f"{table.vllm_version} (no `vllm serve` flag has that dest)",
                code=ErrorCode.UNKNOWN_FLAG,
                field=name,
            )
        if name == "model":
            raise ConfigError(
                "give the model once, as apply_rollout(model=...)",
                code=ErrorCode.BAD_COMMAND,
                field="model",
            )
        words += _flag_words(action, value)
    return words


def _flag_words(action: Mapping[str, Any], value: Any) -> list[str]:
    flag = next(o for o in action["option_strings"] if o.startswith("--"))
    kind = action["action"]
    if value is None:
        return []
    if kind in ("store_true", "BooleanOptionalAction") and isinstance(value, bool):
        if value:
            return [flag]
        negative = action.get("negative") or []
        return [negative[0]] if negative else []
    if action.get("nargs") in ("+", "*") and isinstance(value, list | tuple):
        return [flag, *(_text(v) for v in value)]
    if kind == "append" and isinstance(value, list | tuple):
        return [w for v in value for w in (flag, _text(v))]
    return [flag, _text(value)]


def _text(value: Any) -> str:
    """A value as its flag reads it: JSON for containers, ``true``/``false`` for booleans."""
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
