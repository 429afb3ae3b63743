"""YAML loading that remembers where every key and value came from.

PyYAML's composed node tree carries 0-based marks; :func:`load_with_positions` walks it once and
returns the plain data together with a :class:`Positions` index from a path (the tuple of keys
and list indices that pydantic also reports as an error's ``loc``) to a 1-based (line, column).
Duplicate mapping keys, which PyYAML would silently collapse, are reported as errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oracle.errors import Issue, PackError

PathKey = tuple[str | int, ...]


@dataclass
class Positions:
    """``value[path]`` is where the value at ``path`` starts; ``key[path]`` where its key is."""

    file: str
    value: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    key: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def at(self, path: Sequence[str | int], *, prefer_key: bool = False) -> tuple[int, int]:
        """The position of ``path`` or of its longest known prefix (1, 1 when none is known)."""
        p: PathKey = tuple(path)
        while True:
            if prefer_key and p in self.key:
                return self.key[p]
            if p in self.value:
                return self.value[p]
            if p in self.key:
                return self.key[p]
            if not p:
                return (1, 1)
            p = p[:-1]

    def issue(self, path: Sequence[str | int], message: str, *, prefer_key: bool = False,
              severity: str = "error") -> Issue:
        line, col = self.at(path, prefer_key=prefer_key)
        return Issue(self.file, line, col, message, severity)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _Walker:
    def __init__(self, pos: Positions, text: str) -> None:
        self.pos = pos
        self.loader = yaml.SafeLoader(text)
        self.issues: list[Issue] = []

    def build(self, node: yaml.Node, path: PathKey) -> Any:
        self.pos.value[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node, deep=True)
                if not isinstance(key, str | int) or isinstance(key, bool):
                    self.issues.append(Issue(self.pos.file, *_mark(key_node),
                                             "mapping keys must be strings (quote yes/no/on/off)"))
                    continue
                if key in out:
                    line, col = _mark(key_node)
                    first = self.pos.key.get((*path, key), (0, 0))[0]
                    self.issues.append(Issue(self.pos.file, line, col,
                                             f"duplicate key {key!r} (first at line {first})"))
                    continue
                self.pos.key[(*path, key)] = _mark(key_node)
                out[key] = self.build(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self.loader.construct_object(node, deep=True)


def load_with_positions(path: Path, *, display_name: str | None = None) -> tuple[Any, Positions]:
    """Parse the YAML (or JSON) file at ``path``.

    Returns ``(data, positions)``. Raises :class:`PackError` naming file:line:column for a
    syntax error or a duplicate key.
    """
    name = display_name or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PackError([Issue(name, 1, 1, f"cannot read: {exc.strerror or exc}")]) from exc
    return load_text_with_positions(text, name)


def load_text_with_positions(text: str, name: str) -> tuple[Any, Positions]:
    """Like :func:`load_with_positions` for text already in memory."""
    pos = Positions(name)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise PackError([Issue(name, line, col, f"YAML syntax: {exc.problem or exc}")]) from exc
    if node is None:
        return None, pos
    walker = _Walker(pos, text)
    data = walker.build(node, ())
    if walker.issues:
        raise PackError(walker.issues)
    return data, pos
