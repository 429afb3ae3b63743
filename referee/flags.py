"""The ``vllm serve`` flag table of the installed vLLM release, read from its own parser.

``vllm serve`` is the ``serve`` sub-parser of vLLM's top-level ``FlexibleArgumentParser``
(``vllm/entrypoints/cli/main.py``), filled by ``make_arg_parser`` (``vllm.entrypoints.
launchers.cli_args`` up to 0.32, ``vllm.entrypoints.common.cli_args`` in 0.33): the positional
``model_tag``, ``--headless``, ``--api-server-count``, ``--config``, ``--grpc``, then
``FrontendArgs.add_cli_args`` and ``AsyncEngineArgs.add_cli_args``. :func:`serve_parser`
builds that pair exactly as ``vllm serve`` does (on a CUDA ``Platform`` of the referee, since
``DeviceConfig``'s default asks the platform); :func:`flag_table` dumps every action (option
strings as the parser registered them, dest, type by name, nargs, const, choices, action
kind, JSON-serialisable defaults) and, for the JSON-valued flags, the fields of the config
classes that validate them (:mod:`referee.flags_schema`). ``python -m referee flags`` writes it
to ``policies/reference/vllm-<release>/flags.json``, which :mod:`oracle.sources.command_parser`
builds its parser from.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
from typing import Any

from referee.flags_schema import config_schemas

# Where make_arg_parser lives, per release (it moved in 0.33).
_CLI_ARGS = {"0.33": "vllm.entrypoints.common.cli_args"}
_CLI_ARGS_DEFAULT = "vllm.entrypoints.launchers.cli_args"
# Lambdas vLLM passes as argparse types, by their source (normalised): the oracle implements
# each name; a lambda not listed here is written as "unknown:..." and the oracle refuses the
# table (tests/oracle/test_command_table.py), so a new release cannot slip one by.
_LAMBDAS = {
    'lambda s: s.lower().replace("-", "_")': "lower_dashes_to_underscores",
    "lambda s: [ int(device_id) if device_id.isdigit() else device_id for device_id in "
    '(part.strip() for part in s.split(",")) ]': "device_ids",
}
# Behaviours of FlexibleArgumentParser that the oracle re-implements; their source's digest is
# recorded so that a release that changes them shows up as a changed table.
_PREPROCESS = ("parse_args", "_pull_args_from_config", "load_config_file")


def serve_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``(vllm, vllm serve)``: the installed release's top-level parser and its ``serve``
    sub-parser, built as ``vllm/entrypoints/cli/main.py`` and ``serve.py`` build them."""
    import vllm
    import vllm.platforms as vp
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from referee.build import make_platform

    if not isinstance(vp._current_platform, type(make_platform({"platform": "cuda"}))):
        vp._current_platform = make_platform({"platform": "cuda"})
    release = ".".join(vllm.__version__.split(".")[:2])
    module = importlib.import_module(_CLI_ARGS.get(release, _CLI_ARGS_DEFAULT))
    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    top.add_argument("-v", "--version", action="version", version=vllm.__version__)
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]")
    serve = module.make_arg_parser(serve)
    return top, serve


def _closure(fn: Any) -> dict[str, Any]:
    cells = (c.cell_contents for c in fn.__closure__)
    return dict(zip(fn.__code__.co_freevars, cells, strict=True))


def type_name(fn: Any) -> str | None:
    """The name the oracle knows an argparse ``type`` callable by: ``int``, ``json``,
    ``optional(int)``, ``parse_type(json)``, ``dataclass(CompilationConfig)``,
    ``human_readable_int``, ... (None: argparse's default, the string itself)."""
    if fn is None:
        return None
    if fn in (int, float, str):
        return fn.__name__
    if fn is json.loads:
        return "json"
    qual = getattr(fn, "__qualname__", "")
    name = getattr(fn, "__name__", "")
    if qual.startswith(("optional_type.", "parse_type.")):
        inner = _closure(fn)
        wrapper = "optional" if qual.startswith("optional_type.") else "parse_type"
        return f"{wrapper}({type_name(inner['return_type'])})"
    if qual.endswith("parse_dataclass"):
        return f"dataclass({fn.__defaults__[0].__name__})"
    if name in ("human_readable_int", "human_readable_int_or_auto", "union_dict_and_str"):
        return name
    if name == "parse_reasoning_parser":  # 0.33: "none" in any case is the unset default
        return "reasoning_parser"
    if name == "<lambda>":
        source = " ".join(inspect.getsource(fn).split())
        for text, known in _LAMBDAS.items():
            if text in source.replace("( ", "(").replace(" )", ")") or text in source:
                return known
        return f"unknown:{source[:120]}"
    return f"unknown:{getattr(fn, '__module__', '')}.{qual or repr(fn)}"


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None if value is None else {"unserialisable": type(value).__name__}
    return value


def _action_kind(action: argparse.Action) -> str:
    name = type(action).__name__
    return {
        "_StoreAction": "store",
        "_StoreTrueAction": "store_true",
        "_StoreFalseAction": "store_false",
        "_StoreConstAction": "store_const",
        "_AppendAction": "append",
        "_HelpAction": "help",
        "_VersionAction": "version",
        "_CountAction": "count",
    }.get(name, name)


def _row(
    action: argparse.Action, registered: dict[int, list[str]], deprecated: set[int]
) -> dict[str, Any]:
    choices = action.choices
    row: dict[str, Any] = {"option_strings": registered.get(id(action), [])}
    if list(action.option_strings) != row["option_strings"]:
        row["shown_as"] = list(action.option_strings)  # argparse's "argument X/Y:" in errors
    row |= _extra(action, row["option_strings"])
    return row | {
        "dest": action.dest,
        "action": _action_kind(action),
        "type": type_name(action.type),
        "nargs": action.nargs,
        "const": _jsonable(action.const),
        "choices": [_jsonable(c) for c in choices] if choices is not None else None,
        "default": _jsonable(action.default),
        "required": action.required,
        "deprecated": id(action) in deprecated or bool(getattr(action, "deprecated", False)),
        "metavar": _jsonable(action.metavar),
    }


def _extra(action: argparse.Action, registered: list[str]) -> dict[str, Any]:
    """What a custom action's own code needs: a switch's negative spellings (``--no-x``,
    0.33's ``--disable-x``), the fields ``--lora-modules`` JSON items are built into."""
    if isinstance(action, argparse.BooleanOptionalAction):
        negatives = getattr(action, "negative_option_strings", None)
        if negatives is None:
            negatives = [o for o in registered if o.startswith("--no-")]
        return {"negative": sorted(negatives)}
    if type(action).__name__ == "LoRAParserAction":
        import dataclasses

        from vllm.entrypoints.openai.models.protocol import LoRAModulePath

        fields = dataclasses.fields(LoRAModulePath)
        return {
            "item_fields": [f.name for f in fields],
            "item_required": [
                f.name
                for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            ],
        }
    return {}


def _deprecated(serve: argparse.ArgumentParser) -> set[int]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    found = getattr(serve, "_deprecated", None) or getattr(
        FlexibleArgumentParser, "_deprecated", set()
    )
    return {id(a) for a in found}


def _preprocess_digest() -> str:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    text = "".join(inspect.getsource(getattr(FlexibleArgumentParser, n)) for n in _PREPROCESS)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _dataclass_of(fn: Any) -> type | None:
    qual = getattr(fn, "__qualname__", "")
    if qual.endswith("parse_dataclass"):
        return fn.__defaults__[0]  # type: ignore[no-any-return]
    if qual.startswith(("optional_type.", "parse_type.")):
        inner = _closure(fn)
        return _dataclass_of(inner["return_type"])
    return None


def _json_flag_classes(serve: argparse.ArgumentParser) -> dict[str, type]:
    """dest -> the config class that validates the flag's JSON (in the parser, for the
    ``dataclass(...)`` types; at start-up, for ``--speculative-config``)."""
    from vllm.config import SpeculativeConfig

    out: dict[str, type] = {}
    for action in serve._actions:
        cls = _dataclass_of(action.type)
        if cls is not None:
            out[action.dest] = cls
    out["speculative_config"] = SpeculativeConfig
    return out


def flag_table() -> dict[str, Any]:
    """The installed release's ``vllm serve`` table (the shape of flags.json)."""
    import sys

    import vllm

    top, serve = serve_parser()
    registered: dict[int, list[str]] = {}
    for option, action in serve._option_string_actions.items():
        registered.setdefault(id(action), []).append(option)
    deprecated = _deprecated(serve)
    actions = [_row(a, registered, deprecated) for a in serve._actions]
    json_flags = _json_flag_classes(serve)
    configs, enums = config_schemas({c.__name__: c for c in json_flags.values()})
    from referee.flags_probe import behaviours

    return {
        "release": ".".join(vllm.__version__.split(".")[:2]),
        "vllm_version": vllm.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "generated_by": "python -m referee flags (referee/flags.py)",
        "parser": {
            "prog": serve.prog,
            "allow_abbrev": serve.allow_abbrev,
            "prefix_chars": serve.prefix_chars,
            "fromfile_prefix_chars": serve.fromfile_prefix_chars,
            "top_level_options": sorted(top._option_string_actions),
            "preprocess_digest": _preprocess_digest(),
        },
        "behaviours": behaviours(top),
        "actions": actions,
        "json_flags": {
            dest: {
                "config": cls.__name__,
                "validated_by": "engine" if dest == "speculative_config" else "parser",
            }
            for dest, cls in sorted(json_flags.items())
        },
        "configs": configs,
        "enums": enums,
    }
