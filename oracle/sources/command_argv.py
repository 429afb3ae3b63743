"""What vLLM's ``FlexibleArgumentParser.parse_args`` does to a command line before argparse.

A line-for-line re-implementation of ``vllm/utils/argparse_utils.py`` (0.29-0.33; the table's
``parser.preprocess_digest`` names the version of that code it was generated from), run on
the words after ``vllm``:

1. ``serve``: the first ``--model X`` / ``--model=X`` is moved to the positional model (a
   warning in vLLM); a line that starts with a flag and names ``--served-model-name`` without
   a ``--config`` is refused (the model must come first);
2. ``--config FILE`` (that exact word; ``--config=FILE`` is left to argparse, which stores it
   and reads nothing) is replaced by the YAML file's keys, inserted after the model so that the
   command line wins: ``true`` -> ``--key``, ``false`` -> dropped (the top-level parser has no
   ``--no-key``), a list -> ``--key a b``, a mapping -> ``--key '<JSON>'``;
3. option names (``--x_y``, up to a ``.`` or ``=``) get dashes for underscores; ``-O3``,
   ``-O=3`` and ``-O 3`` become ``--optimization-level 3``;
4. dotted words (``--x.y v``, ``--x.y=v``, ``-cc.y=v``, ``--x.list+ a,b``; anything starting
   with ``-`` that holds a ``.``, so ``-0.5`` too) are collected into one JSON value per flag,
   appended at the end (they win over a JSON value of the same flag given before); each value
   is JSON when it parses, else a human-readable int (``80g``), else the string.

Errors are vLLM's own: :class:`RewriteError` carries the exception vLLM raises (its type and
message), e.g. ``IndexError: list index out of range`` for a dotted flag with no value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from turnout.oracle.sources.command_types import ArgumentTypeError, human_readable_int

# The digests (flags.json ``parser.preprocess_digest``) of the versions of vLLM's rewriting this
# module re-implements: 0.29-0.30, and 0.31-0.33 (which only added ``snapshot create`` to the
# --config branch, a subcommand other than serve). A table with another digest is refused by
# tests/oracle/test_command_table.py until this module is checked against that code.
REWRITE_DIGESTS = {"b42cdf8412b831de": "0.29", "f44e1e13ce77639a": "0.31"}
_NAME = re.compile(r"(?<=--)[^\.]*")
_MODEL = re.compile(r"^--model(=.+|$)")
_CONFIG = re.compile(r"^--config(=.+|$)")
_SERVED = re.compile(r"^--served[-_]model[-_]name(=.+|$)")


class RewriteError(Exception):
    """vLLM raised before argparse ran: ``kind`` is the exception's type name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def _move_model(args: list[str]) -> list[str]:
    idx = next((i for i, a in enumerate(args) if _MODEL.match(a)), None)
    if idx is None:
        return args
    if args[idx] == "--model":
        if idx + 1 >= len(args):
            raise RewriteError("IndexError", "list index out of range")
        model, rest = args[idx + 1], idx + 2
    else:
        model, rest = args[idx].removeprefix("--model="), idx + 1
    return ["serve", model, *args[1:idx], *args[rest:]]


def _check_served_name(args: list[str]) -> None:
    if (
        len(args) > 1
        and args[1].startswith("-")
        and not any(_CONFIG.match(a) for a in args)
        and any(_SERVED.match(a) for a in args)
    ):
        raise RewriteError(
            "ValueError",
            "`model` should be provided as the first positional "
            "argument when using `vllm serve`. i.e. `vllm serve <model> "
            "--<arg> <value>`.",
        )


def config_file_args(data: Any, top_level_options: frozenset[str]) -> list[str]:
    """``load_config_file``'s words for a YAML document already loaded."""
    if not hasattr(data, "items"):
        raise RewriteError(
            "AttributeError", f"'{type(data).__name__}' object has no attribute 'items'"
        )
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if value:
                out.append(f"--{key}")
            elif f"--no-{key}" in top_level_options:
                out.append(f"--no-{key}")
        elif isinstance(value, list):
            if value:
                out += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def _pull_config(
    args: list[str], load: Callable[[str], Any], top_level_options: frozenset[str]
) -> list[str]:
    if args.count("--config") > 1:
        raise RewriteError("AssertionError", "More than one config file specified!")
    index = args.index("--config")
    if index == len(args) - 1:
        raise RewriteError(
            "ValueError", "No config file specified! Please check your command-line arguments."
        )
    path = args[index + 1]
    extension = path.split(".")[-1]
    if extension not in ("yaml", "yml"):
        raise RewriteError(
            "ValueError", f"Config file must be of a yaml/yml type. {extension} supplied"
        )
    config = config_file_args(load(path), top_level_options)
    model_in_cli = len(args) > 1 and not args[1].startswith("-")
    if not model_in_cli and "--model" not in config:
        raise RewriteError(
            "ValueError",
            "No model specified! Please specify model either as "
            "a positional argument or in a config file.",
        )
    if model_in_cli:
        return args[:2] + config + args[2:index] + args[index + 2 :]
    return args[:1] + config + args[1:index] + args[index + 2 :]


def _names(args: list[str]) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            out.append("--help")
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            out.append(
                _NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
                + (f"={value}" if eq else "")
            )
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def _dotted_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return human_readable_int(text)
        except (ValueError, ArgumentTypeError):
            return text


def _merge(original: dict[str, Any], update: dict[str, Any]) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            _merge(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] += v
        else:
            original[k] = v


def _collect_dotted(args: list[str]) -> list[str]:
    delete: set[int] = set()
    dicts: dict[str, dict[str, Any]] = {}
    for i, arg in enumerate(args):
        if i in delete or not (arg.startswith("-") and "." in arg):
            continue
        if "=" in arg:
            arg, value_text = arg.split("=", 1)
            if "." not in arg:
                continue  # the '.' was only in the value
        else:
            if i + 1 >= len(args):
                raise RewriteError("IndexError", "list index out of range")
            value_text = args[i + 1]
            delete.add(i + 1)
        if arg.endswith("+"):
            arg = arg[:-1]
            value_text = json.dumps(list(value_text.split(",")))
        key, *keys = arg.split(".")
        nested: Any = _dotted_value(value_text)
        for k in reversed(keys):
            nested = {k: nested}
        _merge(dicts.setdefault(key, {}), nested)
        delete.add(i)
    out = [a for i, a in enumerate(args) if i not in delete]
    for key, value in dicts.items():
        out += [key, json.dumps(value)]
    return out


def rewrite(
    args: list[str], load: Callable[[str], Any], top_level_options: frozenset[str]
) -> list[str]:
    """The words argparse receives for ``args`` (the words after ``vllm``, from ``serve``).

    ``load(path)`` returns a ``--config`` file's YAML document (``yaml.safe_load``, as vLLM
    reads it; it raises its own error for a file it cannot read). Raises
    :class:`RewriteError` where vLLM raises.
    """
    if args[:1] == ["serve"]:
        args = _move_model(args)
        _check_served_name(args)
    if "--config" in args:
        args = _pull_config(args, load, top_level_options)
    return _collect_dotted(_names(args))
