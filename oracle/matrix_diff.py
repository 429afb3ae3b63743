"""diff_packs(): the matrix cells whose runner changes between two packs (what an upgrade from
one vLLM release to the next does to every cell, or what an edit to a pack does).

Cells are every architecture either pack lists x the three pins (each pack's own runner
variable) x the union of both packs' scenarios (oracle.matrix), with one exception: a scenario
that sets a field one of the two releases does not have (``pack.unknown_fields``) is left out
of the comparison, since that release refuses the setting by name (``unknown_setting``),
which says nothing about its runner selection; :class:`MatrixDiff` lists those scenarios and,
per pack, the fields it lacks that the other has.

Architectures that no condition of either pack names (rules, steps, derived predicates,
stages), and whose attributes are equal (their family too, when a pack's conditions or stages
read it, and the runner kinds a pack's manifests serve them for), decide alike: one of them
is enumerated, and only the cells that change are decided again for each of the others, so
every :class:`CellChange` carries its own decisions (labels and messages name its
architecture). On the vLLM release packs this decides about a seventh of the cells.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from turnout.oracle.compare import Side, change_of, change_rank, count_changes, only_steps, why
from turnout.oracle.compile_types import ArchInfo
from turnout.oracle.conditions import Condition
from turnout.oracle.config import DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, Decision
from turnout.oracle.matrix import PINS, Scenario, enumerate_matrix, scenarios
from turnout.oracle.pack import Pack


@dataclass(frozen=True)
class CellChange:
    """A cell whose runner differs between two packs (``change``: ``"v1→v2"``, …)."""

    architecture: str
    family: str
    pin: str
    scenario: str
    before: Decision
    after: Decision
    settings: tuple[tuple[str, Any], ...] = ()  # the fields the scenario sets
    # each pack's row config (architecture and pin, before the scenario's settings)
    bases: tuple[DeploymentConfig, DeploymentConfig] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def change(self) -> str:
        return change_of(self.before, self.after) or ""

    def sides(self, before: Pack, after: Pack) -> tuple[Side, Side]:
        """Both decisions with the ``set`` steps that applied under one pack only, when both
        start (decided again on the uncompiled path: for a few thousand cells, not for whole
        matrices)."""
        if self.bases is None or not (self.before.runner and self.after.runner):
            return Side(before.name, self.before), Side(after.name, self.after)
        changes = dict(self.settings)
        a_cfg, b_cfg = (base._trusted_replace(changes) if changes else base for base in self.bases)
        a, b = only_steps(before, after, a_cfg, b_cfg)
        return Side(before.name, self.before, a), Side(after.name, self.after, b)


@dataclass(frozen=True)
class MatrixDiff:
    """The comparison of two packs' matrices.

    ``num_cells``: cells compared (architectures x 3 pins x ``scenarios``); ``changes``: those
    whose runner differs, by architecture, pin and scenario; ``left_out``: scenarios not
    compared because they set a field in ``unknown_before`` (fields the first pack's release
    lacks and the second has) or ``unknown_after`` (the reverse)."""

    before: Pack
    after: Pack
    num_cells: int
    scenarios: tuple[Scenario, ...]
    changes: tuple[CellChange, ...]
    left_out: tuple[Scenario, ...]
    unknown_before: tuple[str, ...]
    unknown_after: tuple[str, ...]


def unknown_fields(before: Pack, after: Pack) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fields ``before``'s release lacks that ``after``'s has, the reverse), sorted."""
    a, b = set(before.data.unknown_fields), set(after.data.unknown_fields)
    return tuple(sorted(a - b)), tuple(sorted(b - a))


def diff_packs(
    before: Pack, after: Pack, canaries: CanarySnapshot | None = None, *, exact: bool = True
) -> MatrixDiff:
    """Every cell whose runner differs from ``before`` to ``after`` (``canaries`` apply to
    ``before``; ``after`` decides with its rollout.yaml defaults).

    ``exact=False`` (for counts: docs/oracle-releases.md) gives the other architectures of a
    class the decisions of its first one instead of deciding their changed cells again: the
    same runners and reason ids, but labels and messages may name the first architecture."""
    cols: dict[tuple[tuple[str, Any], ...], Scenario] = {}
    for p in (before, after):
        for s in scenarios(p):
            cols.setdefault(s.changes, s)
    lacking = set(before.data.unknown_fields) | set(after.data.unknown_fields)
    compared = [s for s in cols.values() if not any(f in lacking for f, _ in s.changes)]
    left_out = tuple(s for s in cols.values() if any(f in lacking for f, _ in s.changes))
    archs = sorted(set(before.architectures) | set(after.architectures))
    classes = _classes((before, after), archs)
    found = _changed_cells(before, after, canaries, compared, classes, exact)
    order = {s.id: i for i, s in enumerate(compared)}
    found.sort(key=lambda c: (c.architecture, PINS.index(c.pin), order[c.scenario]))
    return MatrixDiff(
        before,
        after,
        len(archs) * len(PINS) * len(compared),
        tuple(compared),
        tuple(found),
        left_out,
        *unknown_fields(before, after),
    )


def _changed_cells(
    before: Pack,
    after: Pack,
    canaries: CanarySnapshot | None,
    compared: list[Scenario],
    classes: dict[str, list[str]],
    exact: bool,
) -> list[CellChange]:
    """The changed cells of each class's first architecture, then the same cells of the
    other members (each decided on its own when ``exact``)."""
    out: list[CellChange] = []
    hits: dict[str, list[CellChange]] = defaultdict(list)
    for change in _pairs(before, after, canaries, compared, list(classes)):
        hits[change.architecture].append(change)
    for first, changes in hits.items():
        out += changes
        for arch in classes[first][1:]:
            out += (
                _again(before, after, canaries, compared, arch, changes)
                if exact
                else [_moved(c, arch, before, after) for c in changes]
            )
    return out


def _again(
    before: Pack,
    after: Pack,
    canaries: CanarySnapshot | None,
    compared: list[Scenario],
    arch: str,
    changes: list[CellChange],
) -> list[CellChange]:
    """The cells of ``arch`` at the pins and scenarios of ``changes``, decided again."""
    out: list[CellChange] = []
    for pin in PINS:
        ids = {c.scenario for c in changes if c.pin == pin}
        if ids:
            cols = [s for s in compared if s.id in ids]
            out += _pairs(before, after, canaries, cols, [arch], (pin,))
    return out


def _moved(c: CellChange, arch: str, before: Pack, after: Pack) -> CellChange:
    info = before.architectures.get(arch) or after.architectures.get(arch)
    return dataclasses.replace(
        c, architecture=arch, family=info.family if info is not None else c.family, bases=None
    )


def _pairs(
    before: Pack,
    after: Pack,
    canaries: CanarySnapshot | None,
    cols: list[Scenario],
    archs: list[str],
    pins: tuple[str, ...] = PINS,
) -> Iterator[CellChange]:
    a_cells = enumerate_matrix(before, canaries, columns=cols, architectures=archs, pins=pins)
    b_cells = enumerate_matrix(after, None, columns=cols, architectures=archs, pins=pins)
    for a, b in zip(a_cells, b_cells, strict=True):
        if a.decision.runner != b.decision.runner:
            yield CellChange(
                a.architecture,
                a.family if a.family != "(unknown)" else b.family,
                a.pin,
                a.scenario.id,
                a.decision,
                b.decision,
                a.scenario.changes,
                (a.base, b.base),
            )


def _classes(packs: tuple[Pack, ...], archs: list[str]) -> dict[str, list[str]]:
    """First architecture of each class → the class's architectures, in ``archs`` order."""
    named = set().union(*(_named_architectures(p) for p in packs))
    by_family = any(_reads_family(p) for p in packs)
    groups: dict[Any, list[str]] = {}
    for arch in archs:
        key: Any = (
            arch
            if arch in named
            else tuple(
                (_attributes(p.architectures.get(arch), by_family), _served_kinds(p, arch))
                for p in packs
            )
        )
        groups.setdefault(key, []).append(arch)
    return {members[0]: members for members in groups.values()}


def _served_kinds(pack: Pack, arch: str) -> tuple[str, ...] | None:
    """The runner kinds some runner of the pack's manifests serves ``arch`` for (None: the
    pack names no manifests and refuses no architecture for want of a runner)."""
    served = pack.data.served
    if served is None:
        return None
    return tuple(sorted(kind for kind, names in served.items() if arch in names))


def _attributes(info: ArchInfo | None, by_family: bool) -> ArchInfo | None:
    if info is None:
        return None
    return dataclasses.replace(
        info, architecture="", family_label="", family=info.family if by_family else ""
    )


def _conditions(pack: Pack) -> Iterable[Condition]:
    d = pack.data
    for rule in d.rules:
        yield from rule.conditions
    for step in d.steps:
        yield from step.conditions
    for stage in d.stages:
        yield from stage.conditions
    for alternatives in d.derived_conditions.values():
        for alternative in alternatives:
            yield from alternative


def _named_architectures(pack: Pack) -> set[str]:
    """Every architecture a condition of the pack names (in any operator)."""
    out: set[str] = set()
    for cond in _conditions(pack):
        if cond.dim != "architecture":
            continue
        for _op, operand in cond.ops:
            many = isinstance(operand, tuple | list | set | frozenset)
            out |= {str(x) for x in operand} if many else {str(operand)}
    return out


def _reads_family(pack: Pack) -> bool:
    return any(s.families for s in pack.data.stages) or any(
        c.dim == "family" for c in _conditions(pack)
    )


def diff_matrix(
    pack: Pack, other: Pack, canaries: CanarySnapshot | None = None
) -> Iterator[CellChange]:
    """The changed cells of :func:`diff_packs` (kept for callers of the first version)."""
    yield from diff_packs(pack, other, canaries).changes


@dataclass(frozen=True)
class ChangeGroup:
    """The changed cells of one scenario and pin that change the same way. ``families``,
    ``why_before`` and ``why_after`` are (name, cells) pairs, most cells first; a *why* is a
    cell's reason ids joined with " + " (:func:`oracle.compare.why`)."""

    change: str
    scenario: str
    pin: str
    cells: int
    families: tuple[tuple[str, int], ...]
    why_before: tuple[tuple[str, int], ...]
    why_after: tuple[tuple[str, int], ...]


def group_changes(changes: Iterable[CellChange]) -> list[ChangeGroup]:
    """The changes grouped by (change, scenario, pin): toward V2 first, then by size."""
    groups: dict[tuple[str, str, str], list[CellChange]] = defaultdict(list)
    for c in changes:
        groups[(c.change, c.scenario, c.pin)].append(c)
    out = [
        ChangeGroup(
            change,
            scenario,
            pin,
            len(cs),
            _most(c.family for c in cs),
            _most(" + ".join(why(c.before)) for c in cs),
            _most(" + ".join(why(c.after)) for c in cs),
        )
        for (change, scenario, pin), cs in groups.items()
    ]
    out.sort(key=lambda g: (change_rank(g.change), -g.cells, g.scenario, PINS.index(g.pin)))
    return out


def family_counts(changes: Iterable[CellChange]) -> dict[str, dict[str, int]]:
    """Family → change → cells (families sorted by name)."""
    out: dict[str, list[str]] = defaultdict(list)
    for c in changes:
        out[c.family].append(c.change)
    return {fam: count_changes(out[fam]) for fam in sorted(out)}


def _most(names: Iterable[str]) -> tuple[tuple[str, int], ...]:
    counts = Counter(names)
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# -- text of a comparison (the CLI and docs/oracle-releases.md) ---------------------------------

GROUP_HEADER = ("change", "scenario", "pin", "cells", "families", "why ({a})", "why ({b})")


def left_out_fields(diff: MatrixDiff) -> list[dict[str, Any]]:
    """Each scenario left out: its id and, per field it sets that a release lacks, which
    packs lack it."""
    lacking = {p.name: set(p.data.unknown_fields) for p in (diff.before, diff.after)}
    out = []
    for s in diff.left_out:
        fields = {
            f: [name for name, unknown in lacking.items() if f in unknown]
            for f, _ in s.changes
            if any(f in u for u in lacking.values())
        }
        out.append({"scenario": s.id, "fields": fields})
    return out


def unknown_lines(diff: MatrixDiff) -> list[str]:
    """The sentences that say which fields each release does not know, and what was left out."""
    a, b = diff.before.name, diff.after.name
    lines = [
        f"fields {a} does not know (and {b} does): {', '.join(diff.unknown_before) or 'none'}",
        f"fields {b} does not know (and {a} does): {', '.join(diff.unknown_after) or 'none'}",
    ]
    if diff.left_out:
        parts = []
        for item in left_out_fields(diff):
            lacks = "; ".join(
                f"{f}: not in {' or '.join(packs)}" for f, packs in item["fields"].items()
            )
            parts.append(f"{item['scenario']} ({lacks})")
        lines.append(
            f"left out, as they set a field a release refuses by name "
            f"(unknown_setting): {', '.join(parts)}"
        )
    return lines


def _why_text(pairs: tuple[tuple[str, int], ...], total: int, n: int = 2) -> str:
    if len(pairs) == 1:
        return pairs[0][0]
    text = ", ".join(f"{name} ({cells})" for name, cells in pairs[:n])
    rest = total - sum(cells for _, cells in pairs[:n])
    return text + (f", other ({rest})" if rest else "")


def group_row(g: ChangeGroup) -> list[str]:
    """A group as table cells (the Rich table and docs/oracle-releases.md)."""
    families = ", ".join(f"{f} ({n})" for f, n in g.families[:3])
    if len(g.families) > 3:
        families += f", {len(g.families) - 3} more"
    return [
        g.change,
        g.scenario,
        g.pin,
        str(g.cells),
        families,
        _why_text(g.why_before, g.cells),
        _why_text(g.why_after, g.cells),
    ]
