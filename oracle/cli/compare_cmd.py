"""``turnout decide ... --compare OTHER``: each deployment decided by two packs (a vLLM upgrade
of a fleet: ``--pack vllm-0.31 --compare vllm-0.32``), the ones whose runner changes, why on
each side, and counts per change and per family; as Rich tables, Markdown or one JSON object.

Exit codes: 0 no deployment changes runner, 1 some do (as ``diff``), 2 the input could not be
read at all (an unknown pack, a missing file). Lines that cannot be parsed are reported one by
one and counted; they do not change the exit code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from turnout.oracle.cli.console import folding_table
from turnout.oracle.cli.inputs import Item
from turnout.oracle.compare import (
    BAD_INPUT,
    DeploymentChange,
    FamilySummary,
    Side,
    by_family,
    change_rank,
    count_changes,
    sides,
)
from turnout.oracle.decision import CanarySnapshot, Decision
from turnout.oracle.errors import ErrorCode
from turnout.oracle.pack import Pack

EXIT_SAME, EXIT_CHANGED = 0, 1


def compare_items(
    items: Sequence[Item],
    before: Pack,
    after: Pack,
    canaries: CanarySnapshot | None,
    after_items: Sequence[Item] | None = None,
) -> list[DeploymentChange]:
    """Each item under both packs (``canaries`` apply to ``before``). ``after_items``: the same
    input read by ``after``'s release (its own ``vllm serve`` parser), item for item; a line
    only one release reads is a refusal on the other side (a flag the new release removed:
    ``v1→refuse``), a line neither reads is bad input."""
    out = []
    for n, item in enumerate(items):
        later = after_items[n] if after_items is not None else item
        if item.config is None and later.config is None:
            out.append(
                DeploymentChange(item.id, item.model, None, None, item.error, item.error_code)
            )
        elif later.config is None:
            assert item.config is not None
            out.append(
                DeploymentChange(
                    item.id,
                    item.model,
                    Side(before.name, before.decide(item.config, canaries)),
                    Side(after.name, _refused(after, item, later)),
                )
            )
        elif item.config is None:
            out.append(
                DeploymentChange(
                    item.id,
                    later.model,
                    Side(before.name, _refused(before, later, item)),
                    Side(after.name, after.decide(later.config)),
                )
            )
        else:
            out.append(
                DeploymentChange(
                    item.id,
                    item.model,
                    *sides(before, after, item.config, canaries, after_config=later.config),
                )
            )
    return out


def _refused(pack: Pack, read: Item, unread: Item) -> Decision:
    """``pack``'s refusal of the deployment ``read`` (as the other release read it) for the
    reason ``unread`` carries."""
    assert read.config is not None
    return pack.refusal(
        read.config,
        unread.error or "not readable by this release",
        unread.error_code or ErrorCode.BAD_VALUE,
    )


def compare_json(changes: Sequence[DeploymentChange], before: Pack, after: Pack) -> dict[str, Any]:
    """The ``--json`` object (docs/oracle-api.md, "turnout decide --compare")."""
    moved = [c for c in changes if c.change is not None]
    bad = [c for c in changes if c.before is None]
    return {
        "from": before.name,
        "to": after.name,
        "num_deployments": len(changes),
        "num_changed": len(moved),
        "num_unchanged": len(changes) - len(moved) - len(bad),
        "num_bad_input": len(bad),
        "changes": count_changes(c.change for c in moved),
        "by_family": [s.to_json() for s in by_family(changes)],
        "deployments": [c.to_json() for c in changes],
    }


def exit_status(changes: Sequence[DeploymentChange]) -> int:
    return EXIT_CHANGED if any(c.change is not None for c in changes) else EXIT_SAME


def headline(changes: Sequence[DeploymentChange], before: Pack, after: Pack) -> str:
    moved = [c for c in changes if c.change is not None]
    bad = sum(c.before is None for c in changes)
    counts = ", ".join(f"{k} {n}" for k, n in count_changes(c.change for c in moved).items())
    return (
        f"{len(changes)} deployments from {before.name} to {after.name}: {len(moved)} "
        f"change runner{f' ({counts})' if counts else ''}, "
        f"{len(changes) - len(moved) - bad} keep it, {bad} could not be read"
    )


def _kinds(summaries: Sequence[FamilySummary]) -> list[str]:
    """The changes any family has, in report order."""
    seen = {k for s in summaries for k in s.changes}
    return sorted(seen, key=lambda k: (change_rank(k), k))


def _pairs(pairs: list[tuple[str, int]]) -> str:
    return ", ".join(f"{k} ({n})" for k, n in pairs)


def family_rows(
    changes: Sequence[DeploymentChange], labels: dict[str, str]
) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the per-family summary."""
    summaries = by_family(changes)
    kinds = _kinds(summaries)
    header = ["family", "deployments", "changed", *kinds, "why (before)", "why (after)"]
    rows = []
    kept = [s for s in summaries if s.family != BAD_INPUT and not s.changed]
    for s in summaries:
        if s in kept:
            continue
        # the unreadable lines' error codes go in the first why column
        why_a = "" if s.family == BAD_INPUT else _pairs(s.why_after)
        rows.append(
            [
                labels.get(s.family, s.family),
                str(s.deployments),
                str(s.changed),
                *(str(s.changes.get(k, 0)) for k in kinds),
                _pairs(s.why_before),
                why_a,
            ]
        )
    if kept:
        row = [
            f"(no change: {len(kept)} famil{'y' if len(kept) == 1 else 'ies'})",
            str(sum(s.deployments for s in kept)),
            "0",
            *("0" for _ in kinds),
            "",
            "",
        ]
        rows.insert(len(rows) - (rows[-1][0] == BAD_INPUT if rows else 0), row)
    return header, rows


def line_rows(changes: Sequence[DeploymentChange]) -> list[list[str]]:
    """Rows (id, model, family, change, why before, why after) of the changed deployments."""
    return [
        [
            c.id or "-",
            c.model or "-",
            c.family or "-",
            c.change or "",
            " + ".join(c.before.why()),
            " + ".join(c.after.why()),
        ]
        for c in changes
        if c.change is not None and c.before and c.after
    ]


def bad_rows(changes: Sequence[DeploymentChange]) -> list[list[str]]:
    return [
        [c.id or "-", str(c.error_code or "bad_input"), c.error or ""]
        for c in changes
        if c.before is None
    ]


def print_compare(
    console: Console,
    changes: Sequence[DeploymentChange],
    before: Pack,
    after: Pack,
    *,
    summary_only: bool,
    markdown: bool,
) -> None:
    """The comparison as Rich tables or Markdown: the headline, the per-family summary and,
    unless ``summary_only``, the deployments that change runner and the lines not read."""
    a, b = before.name, after.name
    header, rows = family_rows(changes, {**before.families, **after.families})
    header = [h.replace("(before)", f"({a})").replace("(after)", f"({b})") for h in header]
    lines = line_rows(changes)
    line_header = ["id", "model", "family", "change", f"why ({a})", f"why ({b})"]
    tables = [(headline(changes, before, after), header, rows)]
    if not summary_only and lines:
        tables.append(("deployments that change runner", line_header, lines))
    bad = bad_rows(changes)
    if bad and not summary_only:
        tables.append(("lines that could not be read", ["id", "error code", "error"], bad))
    for n, (title, head, body) in enumerate(tables):
        if markdown:
            _markdown(title, head, body, first=n == 0)
            continue
        table = folding_table(*(escape(h) for h in head), title=escape(title))
        for row in body:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)


def _markdown(title: str, header: list[str], rows: list[list[str]], *, first: bool) -> None:
    print(("" if first else "\n") + f"**{title}**\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


def print_compare_json(changes: Sequence[DeploymentChange], before: Pack, after: Pack) -> None:
    print(json.dumps(compare_json(changes, before, after)))
