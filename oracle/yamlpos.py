"""YAML loading that remembers where every key and value came from.

PyYAML's composed node tree carries 0-based marks; :func:`load_with_positions` walks it once and
returns the plain data together with a :class:`Positions` index from a path (the tuple of keys
and list indices that pydantic also reports as an error's ``loc``) to a 1-based (line, column).
Duplicate mapping keys, which PyYAML would silently collapse, are reported as errors.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from turnout.oracle import bounded_json
from turnout.oracle.errors import Issue, PackError

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

    def issue(
        self,
        path: Sequence[str | int],
        message: str,
        *,
        prefer_key: bool = False,
        severity: str = "error",
    ) -> Issue:
        line, col = self.at(path, prefer_key=prefer_key)
        return Issue(self.file, line, col, message, severity)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


# Values a document may repeat through aliases (the shipped packs use none): a few nested
# aliases ("billion laughs") would otherwise expand into millions of values.
MAX_ALIASED_NODES = 100_000


class _Walker:
    def __init__(self, pos: Positions, text: str) -> None:
        self.pos = pos
        self.loader = yaml.SafeLoader(text)
        self.issues: list[Issue] = []
        self.seen: set[int] = set()
        self.num_aliased = 0

    def build(self, node: yaml.Node, path: PathKey) -> Any:
        if id(node) in self.seen:  # an alias: the composer hands back the anchored node
            self.num_aliased += 1
            if self.num_aliased > MAX_ALIASED_NODES:
                raise PackError(
                    [
                        Issue(
                            self.pos.file,
                            *_mark(node),
                            f"more than {MAX_ALIASED_NODES} values repeated "
                            "through aliases (expected a policy pack or a spec, not "
                            "an alias bomb)",
                        )
                    ]
                )
        else:
            self.seen.add(id(node))
        self.pos.value[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node, deep=True)
                if not isinstance(key, str | int) or isinstance(key, bool):
                    self.issues.append(
                        Issue(
                            self.pos.file,
                            *_mark(key_node),
                            "mapping keys must be strings (quote yes/no/on/off)",
                        )
                    )
                    continue
                if key in out:
                    line, col = _mark(key_node)
                    first = self.pos.key.get((*path, key), (0, 0))[0]
                    self.issues.append(
                        Issue(
                            self.pos.file,
                            line,
                            col,
                            f"duplicate key {key!r} (first at line {first})",
                        )
                    )
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
        text = read_text(path, name)
    except OSError as exc:
        raise PackError([Issue(name, 1, 1, f"cannot read: {exc.strerror or exc}")]) from exc
    return load_text_with_positions(text, name)


#: The largest input file read (packs, specs, command lists, snapshots, hub configs): the
#: largest shipped one is a few hundred kilobytes.
MAX_INPUT_FILE_BYTES = 16 << 20


def read_input(path: Path, max_bytes: int = MAX_INPUT_FILE_BYTES) -> bytes:
    """The bytes of an input file, whole, when it is a regular file of at most
    ``max_bytes`` (``MAX_INPUT_FILE_BYTES``, 16 MiB, by default).

    Raises:
        OSError: the file cannot be read; ``EINVAL`` for a FIFO, a device, a socket or a
            directory (``/dev/zero`` would be read until memory ran out, a FIFO would block
            for ever), ``EFBIG`` for a larger file. ``strerror`` says which.
    """
    # Opened without blocking (a FIFO with no writer would hold open() for ever), then checked
    # on the open descriptor: nothing can be swapped in between the check and the read.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode)
                else "a directory" if stat.S_ISDIR(mode)
                else "not a regular file"
            )  # fmt: skip
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes:,} bytes, the most read", str(path))
    return data


class YamlTooLargeError(ValueError):
    """A YAML document that would expand to more than ``MAX_ALIASED_NODES`` values through
    its aliases, or nest deeper than ``MAX_YAML_DEPTH``."""


#: The deepest nesting a YAML input may have (a vLLM ``--config`` is flat; packs nest 4 deep).
MAX_YAML_DEPTH = 64


def safe_load_bounded(text: str) -> Any:
    """``yaml.safe_load(text)``, after checking on the composed node graph that the document
    expands to at most ``MAX_ALIASED_NODES`` values (an alias counts as many as it stands for:
    a 382-byte "billion laughs" document grew without bound) and nests at most
    ``MAX_YAML_DEPTH`` deep. The same semantics otherwise (a duplicated key keeps its last
    value, as vLLM reads its ``--config``).

    Raises:
        YamlTooLargeError: too many values or too deep (checked before anything is built).
        yaml.YAMLError: not YAML, as ``yaml.safe_load`` raises it.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise YamlTooLargeError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    if node is not None:
        _check_expansion(node)
    return yaml.safe_load(text)


def _check_expansion(root: yaml.Node, max_values: int | None = MAX_ALIASED_NODES) -> None:
    """Depth (``MAX_YAML_DEPTH``), no alias inside its own anchor, and, unless ``max_values``
    is None, at most that many values with each alias counted as what it stands for.

    Raises:
        YamlTooLargeError: saying which bound the document passes.
    """
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_YAML_DEPTH:
            raise YamlTooLargeError(f"nested deeper than {MAX_YAML_DEPTH} levels")
        known = sizes.get(id(node))
        if known is not None:
            if known < 0:  # still being counted: an alias inside its own anchor
                raise YamlTooLargeError("an alias refers to the node that holds it")
            return known
        sizes[id(node)] = -1
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item, depth + 1) for item in node.value)
        else:
            total = 1
        if max_values is not None and total > max_values:
            raise YamlTooLargeError(
                f"it holds more than {max_values} values, counting each alias as the "
                "values it stands for (an alias bomb, or a file far larger than a config)"
            )
        sizes[id(node)] = total
        return total

    size(root, 1)


def read_text(path: Path, name: str | None = None) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped), read by ``read_input``.

    Raises OSError when the file cannot be read (or is no regular file, or too large), and
    :class:`PackError` naming the line and column of the first byte that is not UTF-8.
    """
    data = read_input(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PackError([_not_utf8(name or str(path), data, exc.start, 1)]) from None


def read_lines(path: Path, name: str | None = None) -> list[str | Issue]:
    """The lines of a UTF-8 text file, split at line ends only (a U+2028 inside a JSON string
    does not end a line). A line holding a byte that is not UTF-8 comes back as the Issue that
    names it; the other lines are unaffected. Raises OSError when the file cannot be read
    (``read_input``: no regular file, or too large)."""
    name = name or str(path)
    out: list[str | Issue] = []
    for n, raw in enumerate(read_input(path).splitlines(), start=1):
        try:
            out.append(raw.decode("utf-8-sig" if n == 1 else "utf-8"))
        except UnicodeDecodeError as exc:
            out.append(_not_utf8(name, raw, exc.start, n))
    return out


def _not_utf8(name: str, data: bytes, start: int, first_line: int) -> Issue:
    line = first_line + data.count(b"\n", 0, start)
    column = start - data.rfind(b"\n", 0, start)
    return Issue(
        name, line, column, f"byte 0x{data[start]:02x} is not UTF-8 (expected a UTF-8 text file)"
    )


def load_json_with_positions(text: str, name: str) -> tuple[Any, Positions]:
    """Parse JSON strictly (``json`` module: no trailing commas, no YAML-only syntax), with the
    positions of its keys and values. Raises :class:`PackError` naming line:column of invalid
    JSON or of a duplicate key."""
    try:
        data = bounded_json.loads(text)
    except json.JSONDecodeError as exc:
        raise PackError([Issue(name, exc.lineno, exc.colno, f"invalid JSON: {exc.msg}")]) from None
    except bounded_json.TooDeepError as exc:
        raise PackError([Issue(name, 1, 1, f"invalid JSON: {exc}")]) from None
    # Valid JSON is YAML, except that YAML does not allow tabs as indentation; outside strings
    # a tab is whitespace (inside JSON strings tabs are escaped), so a space keeps the columns.
    try:
        _, pos = load_text_with_positions(text.replace("\t", " "), name)
    except PackError as exc:
        if any(i.message.startswith("duplicate key") for i in exc.issues):
            raise
        pos = Positions(name)
    return data, pos


def load_text_with_positions(text: str, name: str) -> tuple[Any, Positions]:
    """Like :func:`load_with_positions` for text already in memory."""
    pos = Positions(name)
    too_deep = Issue(
        name, 1, 1, f"nested deeper than {MAX_YAML_DEPTH} levels, or an alias that holds itself"
    )
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise PackError([Issue(name, line, col, f"YAML syntax: {exc.problem or exc}")]) from exc
    except RecursionError:  # PyYAML's composer recurses once per level
        raise PackError([too_deep]) from None
    if node is None:
        return None, pos
    walker = _Walker(pos, text)
    try:
        # Before anything is built: depth, and no alias of itself (the walker counts what
        # aliases repeat, MAX_ALIASED_NODES).
        _check_expansion(node, max_values=None)
        data = walker.build(node, ())
    except (YamlTooLargeError, RecursionError) as exc:
        issue = too_deep if isinstance(exc, RecursionError) else Issue(name, 1, 1, str(exc))
        raise PackError([issue]) from None
    if walker.issues:
        raise PackError(walker.issues)
    return data, pos
