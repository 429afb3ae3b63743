"""``turnout matrix --diff``: the cells whose runner changes between two packs, for people (a
Rich table per change, scenario and pin, with the reasons of both sides) and scripts (one JSON
object)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from turnout.oracle.cli.console import folding_table
from turnout.oracle.compare import count_changes
from turnout.oracle.matrix_diff import (
    GROUP_HEADER,
    MatrixDiff,
    family_counts,
    group_changes,
    group_row,
    left_out_fields,
    unknown_lines,
)


def diff_json(diff: MatrixDiff, *, cells: bool) -> dict[str, Any]:
    """The ``--json`` object (docs/oracle-api.md, "turnout matrix --diff")."""
    a, b = diff.before.name, diff.after.name
    groups = group_changes(diff.changes)
    out: dict[str, Any] = {
        "from": a,
        "to": b,
        "cells": diff.num_cells,
        "changed_cells": len(diff.changes),
        "changes": count_changes(c.change for c in diff.changes),
        "unknown_fields": {a: list(diff.unknown_before), b: list(diff.unknown_after)},
        "left_out": left_out_fields(diff),
        "by_family": family_counts(diff.changes),
        "groups": [
            {
                "change": g.change,
                "scenario": g.scenario,
                "pin": g.pin,
                "from": g.change.split("→")[0],
                "to": g.change.split("→")[1],
                "cells": g.cells,
                "families": dict(g.families),
                "why_from": dict(g.why_before),
                "why_to": dict(g.why_after),
            }
            for g in groups
        ],
    }
    if cells:
        out["changed"] = [_cell_json(c, diff) for c in diff.changes]
    return out


def _cell_json(c: Any, diff: MatrixDiff) -> dict[str, Any]:
    before, after = c.sides(diff.before, diff.after)
    return {
        "architecture": c.architecture,
        "family": c.family,
        "pin": c.pin,
        "scenario": c.scenario,
        "settings": {k: _plain(v) for k, v in c.settings},
        "change": c.change,
        "before": before.to_json(),
        "after": after.to_json(),
    }


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def print_diff(console: Console, diff: MatrixDiff, *, as_json: bool, cells: bool) -> None:
    """The comparison, as one JSON object or as Rich tables."""
    if as_json:
        print(json.dumps(diff_json(diff, cells=cells)))
        return
    a, b = diff.before.name, diff.after.name
    counts = count_changes(c.change for c in diff.changes)
    title = f"{len(diff.changes)} of {diff.num_cells} cells change runner from {a} to {b}" + (
        ": " + ", ".join(f"{k} {n}" for k, n in counts.items()) if counts else ""
    )
    if cells:
        _print_cells(console, diff, title)
    else:
        table = folding_table(
            *(h.format(a=escape(a), b=escape(b)) for h in GROUP_HEADER), title=escape(title)
        )
        for g in group_changes(diff.changes):
            table.add_row(*(escape(x) for x in group_row(g)))
        console.print(table)
    for line in unknown_lines(diff):
        console.print(escape(line), highlight=False)


def _print_cells(console: Console, diff: MatrixDiff, title: str) -> None:
    a, b = diff.before.name, diff.after.name
    table = folding_table(
        "architecture",
        "family",
        "pin",
        "scenario",
        "change",
        f"why ({escape(a)})",
        f"why ({escape(b)})",
        title=escape(title),
    )
    for c in diff.changes:
        before, after = c.sides(diff.before, diff.after)
        table.add_row(
            *(
                escape(x)
                for x in (
                    c.architecture,
                    c.family,
                    c.pin,
                    c.scenario,
                    c.change,
                    " + ".join(before.why()),
                    " + ".join(after.why()),
                )
            )
        )
    console.print(table)
