"""``vllm serve``'s own parser, rebuilt with argparse from a release's flags.json.

:func:`serve_parser` adds every action of the table to an ``argparse.ArgumentParser`` with
the release's settings (``allow_abbrev``: ``--tensor-parallel 8`` is ``-tp 8``, an ambiguous
prefix is refused), types (:mod:`oracle.sources.command_types`), choices, nargs and action
kinds (``store``, ``store_true``, ``append``, switches with their ``--no-x`` / ``--disable-x``
spellings, ``--lora-modules``' own action), and :meth:`ServeParser.parse` runs vLLM's own
rewriting first (:mod:`oracle.sources.command_argv`). The result holds only the flags the line
gave (dest -> parsed value). A refusal is a :class:`ParseRefusal` worded as vLLM's parser
words it (``argument --tensor-parallel-size/-tp: invalid int value: 'two'``,
``unrecognized arguments: --not-a-flag``); a value that fails its type and is a template
placeholder (``$MASTER_PORT``, ``<X>``) is a :class:`PlaceholderValue` instead.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, NoReturn

from turnout.oracle.sources.command_argv import RewriteError, rewrite
from turnout.oracle.sources.command_configs import ConfigValidators
from turnout.oracle.sources.command_table import FlagTable, load_table
from turnout.oracle.sources.command_types import ArgumentTypeError, TypeFn, make_type

PLACEHOLDER = re.compile(r"^<[^>]*>$|<[^<>\s]+>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|^(/)?path/to/")
TASK_HINT = (
    "\n\nHint: --task is not a vllm serve option. For embedding, reranking, or reward "
    "models, use --runner pooling. To adapt a generative model for pooling, also use "
    "--convert embed, --convert classify, or --convert reward."
)


def is_placeholder(value: str) -> bool:
    """True for template text that is not a value: ``<X>``, ``$X``, ``${X}``,
    ``/path/to/...``."""
    return bool(PLACEHOLDER.search(value))


class ParseRefusal(Exception):
    """vLLM's parser refuses the line. ``stage``: ``"parser"`` (argparse or vLLM's rewriting),
    ``"cli"`` (``vllm`` itself, for ``--omni``), ``"startup"`` (the engine's own check of
    ``--speculative-config``); ``unknown``: the refusal is for flags the release does not have
    (or an ambiguous prefix)."""

    def __init__(self, message: str, *, stage: str = "parser", unknown: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage
        self.unknown = unknown


class PlaceholderValue(Exception):
    """A flag's value is a template placeholder that its type refuses."""

    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value
        self.flag = ""  # the flag's first option string
        self.shown = ""  # as argparse names it: --tensor-parallel-size/-tp


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ParseRefusal(
            message, unknown=message.startswith(("unrecognized arguments:", "ambiguous option:"))
        )

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ParseRefusal("-h/--help prints the help and exits: not a deployment")

    def print_help(self, file: Any = None) -> None:
        pass

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if (
            action.choices is not None
            and value not in action.choices
            and isinstance(value, str)
            and is_placeholder(value)
        ):
            raise _placeholder(action, value)
        super()._check_value(action, value)


def _placeholder(action: argparse.Action, value: str) -> PlaceholderValue:
    exc = PlaceholderValue(value)
    exc.flag = action.option_strings[0] if action.option_strings else action.dest
    exc.shown = "/".join(action.option_strings) or action.dest
    return exc


def _guard(fn: TypeFn, action_ref: list[argparse.Action]) -> TypeFn:
    """``fn`` with its ``__name__``; a placeholder it refuses raises PlaceholderValue."""

    def guarded(val: str) -> Any:
        try:
            return fn(val)
        except (ValueError, TypeError, ArgumentTypeError):
            if isinstance(val, str) and is_placeholder(val):
                raise _placeholder(action_ref[0], val) from None
            raise

    guarded.__name__ = getattr(fn, "__name__", repr(fn))
    return guarded


class _Switch(argparse.Action):
    """vLLM's ``BooleanOptionalAction`` / 0.33's ``EnableDisableAction``: false for the
    negative spellings the table lists."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, negative: Sequence[str] = (), **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negative = frozenset(negative)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negative)


class _LoRAModules(argparse.Action):
    """vLLM's ``LoRAParserAction``: ``name=path`` items, or JSON objects of LoRAModulePath's
    fields."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        item_fields: Sequence[str] = (),
        item_required: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.item_fields, self.item_required = set(item_fields), list(item_required)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        import json

        out = []
        for item in values or []:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                out.append(dict(zip(("name", "path"), item.split("=", 1), strict=True)))
                continue
            try:
                entry = json.loads(item)
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            if not isinstance(entry, dict):
                parser.error(
                    f"Invalid fields for --lora-modules: {item} - argument after ** "
                    f"must be a mapping, not {type(entry).__name__}"
                )
            extra = [k for k in entry if k not in self.item_fields]
            missing = [k for k in self.item_required if k not in entry]
            if extra or missing:
                why = (
                    f"unexpected keyword argument '{extra[0]}'"
                    if extra
                    else f"missing required argument '{missing[0]}'"
                )
                parser.error(f"Invalid fields for --lora-modules: {item} - {why}")
            out.append(entry)
        setattr(namespace, self.dest, out)


_PLAIN = {"store", "append", "store_const", "store_true", "store_false", "count"}
_KEYS = {
    "store": ("type", "nargs", "const", "choices", "metavar"),
    "append": ("type", "nargs", "const", "choices", "metavar"),
    "store_const": ("const",),
    "store_true": (),
    "store_false": (),
    "count": (),
}


def _add(
    parser: _Parser, row: dict[str, Any], type_of: Callable[[str | None], TypeFn | None]
) -> None:
    kind, opts = row["action"], row["option_strings"] or [row["dest"]]
    kwargs: dict[str, Any] = {"default": argparse.SUPPRESS}
    if row["option_strings"]:
        kwargs["dest"] = row["dest"]
    ref: list[argparse.Action] = []
    fn = type_of(row["type"])
    typed: dict[str, Any] = {"type": _guard(fn, ref) if fn is not None else None}
    if kind == "help":
        action = parser.add_argument(*opts, action="help")
    elif kind in ("BooleanOptionalAction", "EnableDisableAction"):
        action = parser.add_argument(
            *opts, action=_Switch, negative=row.get("negative", ()), **kwargs
        )
    elif kind == "LoRAParserAction":
        action = parser.add_argument(
            *opts,
            action=_LoRAModules,
            nargs=row["nargs"],
            item_fields=row["item_fields"],
            item_required=row["item_required"],
            **typed,
            **kwargs,
        )
    elif kind in _PLAIN or kind.startswith("Deprecated"):  # a deprecation warning: a store
        kind = "store" if kind.startswith("Deprecated") else kind
        given = row | typed
        extra = {k: given[k] for k in _KEYS[kind] if given[k] is not None}
        action = parser.add_argument(*opts, action=kind, **extra, **kwargs)
    else:
        raise ValueError(
            f"flags.json names an argparse action the oracle does not implement: "
            f"{kind!r} ({opts[0]})"
        )
    ref.append(action)
    if "shown_as" in row:
        action.option_strings = list(row["shown_as"])


@dataclass
class ServeParser:
    """One release's ``vllm serve`` parser."""

    table: FlagTable
    parser: _Parser
    configs: ConfigValidators
    top_level_options: frozenset[str]

    def parse(self, words: list[str], load: Callable[[str], Any]) -> dict[str, Any]:
        """dest -> value for each flag ``words`` (after ``vllm serve``) gives; ``load(path)``
        reads a ``--config`` file's YAML. Raises ParseRefusal or PlaceholderValue."""
        if "--omni" in words:
            raise ParseRefusal(self.table.behaviours["omni_error"], stage="cli", unknown=True)
        try:
            args = rewrite(["serve", *words], load, self.top_level_options)[1:]
        except RewriteError as exc:
            raise ParseRefusal(str(exc)) from None
        try:
            namespace, extras = self.parser.parse_known_args(args)
        except ParseRefusal as exc:
            raise ParseRefusal(
                exc.message + self._hint(words, exc.message), unknown=exc.unknown
            ) from None
        if extras:
            message = f"unrecognized arguments: {' '.join(extras)}"
            raise ParseRefusal(message + self._hint(words, message), unknown=True)
        return vars(namespace)

    @staticmethod
    def _hint(words: list[str], message: str) -> str:
        task = any(re.match(r"^--task(=.+|$)", w) for w in words)
        if (
            task
            and message.startswith("unrecognized arguments:")
            and re.search(r"(^|\s)--task(=|\s|$)", message)
        ):
            return TASK_HINT
        return ""


@cache
def serve_parser(release: str | None = None) -> ServeParser:
    """The parser of ``release`` (None: the newest table), built once."""
    table = load_table(release)
    settings = table.data["parser"]
    parser = _Parser(
        prog=settings["prog"],
        allow_abbrev=settings["allow_abbrev"],
        prefix_chars=settings["prefix_chars"],
        add_help=False,
    )
    configs = ConfigValidators(table.configs, table.enums)
    for row in table.actions:
        _add(parser, row, lambda name: make_type(name, configs.parse_type))
    return ServeParser(table, parser, configs, frozenset(settings["top_level_options"]))
