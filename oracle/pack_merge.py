"""A pack that ``extends`` another: its capability_matrix.yaml merged onto the base's.

A release's pack states only what changed since the release it extends, so ``diff`` of two
packs reads like the release notes. The merge, base first:

- ``pack`` and ``messages``: each key the extending file sets replaces the base's;
- ``dimensions``, ``derived`` and ``texts``: merged by name, the extending file's entry wins;
- ``rules`` and ``steps``: merged by id, in order. An entry whose id the base has replaces it in
  place (or moves it, with ``after``/``before``); a new id goes where ``after``/``before`` say,
  else at the end; ``remove_rules`` / ``remove_steps`` drop inherited ids.

Every merged item keeps the file and position it came from, so an error names the right
file:line:column. Chains are followed up to :data:`MAX_DEPTH` packs; a cycle is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from turnout.oracle.errors import Issue, PackError
from turnout.oracle.paths import POLICIES_DIR, SHIPPED_PACKS
from turnout.oracle.schema import (
    CapabilityMatrix,
    Derived,
    Dimension,
    Messages,
    PackMeta,
    Rule,
    Step,
)
from turnout.oracle.validate import validate_model
from turnout.oracle.yamlpos import PathKey, Positions, load_with_positions

MAX_DEPTH = 8
_T = TypeVar("_T")


@dataclass
class Located(Generic[_T]):
    """A merged item and where it was written."""

    item: _T
    pos: Positions
    path: PathKey


@dataclass
class MergedMatrix:
    """The capability matrix after the ``extends`` chain, base first."""

    meta: dict[str, Any]
    messages: dict[str, Any]
    message_pos: dict[str, Located[Any]]
    dimensions: dict[str, Located[Dimension]]
    derived: dict[str, Located[Derived]]
    texts: dict[str, Located[str]]
    rules: list[Located[Rule]]
    steps: list[Located[Step]]
    meta_pos: Positions
    files: list[Path] = field(default_factory=list)


def load_matrix_chain(folder: Path, issues: list[Issue]) -> MergedMatrix | None:
    """Load ``folder``'s capability_matrix.yaml and every pack it extends; None (with the
    problems in ``issues``) when a file cannot be read or validated."""
    chain: list[tuple[CapabilityMatrix, Positions, Path]] = []
    seen: set[Path] = set()
    current: Path | None = folder.resolve()
    while current is not None:
        path = current / "capability_matrix.yaml"
        if current in seen or len(chain) >= MAX_DEPTH:
            first = chain[0][1] if chain else Positions(str(path))
            issues.append(
                first.issue(
                    ("pack", "extends"),
                    f"extends forms a cycle or a chain longer than {MAX_DEPTH} packs",
                )
            )
            return None
        seen.add(current)
        try:
            data, pos = load_with_positions(path)
            matrix = validate_model(CapabilityMatrix, data, pos)
        except PackError as exc:
            issues += exc.issues
            return None
        except OSError:
            issues.append(Issue(str(path), 1, 1, "missing pack file"))
            return None
        chain.append((matrix, pos, path))
        current = _base_folder(matrix, pos, current, issues) if matrix.pack.extends else None
        if matrix.pack.extends and current is None:
            return None
    chain.reverse()
    return _merge(chain, issues)


def _base_folder(
    matrix: CapabilityMatrix, pos: Positions, folder: Path, issues: list[Issue]
) -> Path | None:
    name = matrix.pack.extends or ""
    candidate = POLICIES_DIR / name if name in SHIPPED_PACKS else (folder / name).resolve()
    if not (candidate / "capability_matrix.yaml").is_file():
        issues.append(
            pos.issue(
                ("pack", "extends"),
                f"extends {name!r}: no pack there "
                "(a shipped pack name or a folder relative to this pack)",
            )
        )
        return None
    return candidate


def _merge(
    chain: list[tuple[CapabilityMatrix, Positions, Path]], issues: list[Issue]
) -> MergedMatrix:
    base = chain[0][0]
    out = MergedMatrix(
        meta={},
        messages={},
        message_pos={},
        dimensions={},
        derived={},
        texts={},
        rules=[],
        steps=[],
        meta_pos=chain[-1][1],
        files=[p for _, _, p in chain],
    )
    for matrix, pos, _ in chain:
        out.meta.update({k: getattr(matrix.pack, k) for k in matrix.pack.model_fields_set})
        for key in matrix.messages.model_fields_set:
            out.messages[key] = getattr(matrix.messages, key)
            out.message_pos[key] = Located(None, pos, ("messages", key))
        for name, dim in matrix.dimensions.items():
            out.dimensions[name] = Located(dim, pos, ("dimensions", name))
        for name, der in matrix.derived.items():
            out.derived[name] = Located(der, pos, ("derived", name))
        for name, text in matrix.texts.items():
            out.texts[name] = Located(text, pos, ("texts", name))
        out.rules = _merge_list(
            out.rules, matrix.rules, matrix.remove_rules, pos, "rules", "remove_rules", issues
        )
        out.steps = _merge_list(
            out.steps, matrix.steps, matrix.remove_steps, pos, "steps", "remove_steps", issues
        )
    if not base.pack.extends:
        out.meta.setdefault("env_parse", "strict")
    return out


def _merge_list(
    current: list[Located[Any]],
    new: list[Any],
    remove: list[str],
    pos: Positions,
    key: str,
    remove_key: str,
    issues: list[Issue],
) -> list[Located[Any]]:
    items = list(current)
    ids = [x.item.id for x in items]
    for i, rid in enumerate(remove):
        if rid not in ids:
            issues.append(
                pos.issue(
                    (remove_key, i), f"{remove_key}: no inherited {key[:-1]} {rid!r} to remove"
                )
            )
    items = [x for x in items if x.item.id not in set(remove)]
    own: dict[str, int] = {}
    for i, entry in enumerate(new):
        located = Located(entry, pos, (key, i))
        if entry.id in own:  # twice in one file: a mistake, not an override
            issues.append(
                pos.issue(
                    (key, i, "id"),
                    f"duplicate {key[:-1]} id {entry.id!r} (first is {key}[{own[entry.id]}])",
                )
            )
            continue
        own[entry.id] = i
        ids = [x.item.id for x in items]
        anchor = entry.after or entry.before
        if entry.id in ids and anchor is None:
            items[ids.index(entry.id)] = located
            continue
        if entry.id in ids:
            items.pop(ids.index(entry.id))
            ids = [x.item.id for x in items]
        if anchor is None:
            items.append(located)
        elif anchor not in ids:
            issues.append(
                pos.issue(
                    (key, i, "after" if entry.after else "before"),
                    f"no {key[:-1]} {anchor!r} to place {entry.id!r} next to",
                )
            )
            items.append(located)
        else:
            at = ids.index(anchor) + (1 if entry.after else 0)
            items.insert(at, located)
    return items


def merged_meta(merged: MergedMatrix, issues: list[Issue]) -> PackMeta:
    """The pack's own description after the chain; env_var must be set somewhere in it."""
    meta = PackMeta(**{k: v for k, v in merged.meta.items()})
    if meta.env_var is None:
        issues.append(
            merged.meta_pos.issue(
                ("pack",),
                "the pack (or one it extends) must name its runner variable: pack.env_var",
            )
        )
    return meta


def merged_messages(merged: MergedMatrix) -> Messages:
    return Messages(**merged.messages)
