"""Rendering of decisions for people (Rich) and scripts (JSON lines), and exit codes."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from turnout.oracle.cli.canaries import Canaries
from turnout.oracle.cli.console import folding_table
from turnout.oracle.cli.inputs import Item
from turnout.oracle.decision import Decision
from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.pack import Pack

EXIT_OK, EXIT_BAD_INPUT, EXIT_PIN = 0, 2, 3
_BAD_INPUT_CODES = {ErrorCode.INVALID_ENV, ErrorCode.UNKNOWN_ARCHITECTURE}


def exit_code(results: Sequence[tuple[Item, Decision | None]]) -> int:
    """0 all decided; 2 any bad input (unparseable, unknown architecture, bad runner variable);
    3 otherwise, if a pin (or the config itself) cannot be honoured by any runner."""
    codes = set()
    for _, d in results:
        if d is None or d.error_code in _BAD_INPUT_CODES:
            codes.add(EXIT_BAD_INPUT)
        elif d.runner is None:
            codes.add(EXIT_PIN)
    return EXIT_BAD_INPUT if EXIT_BAD_INPUT in codes else max(codes, default=EXIT_OK)


def result_json(item: Item, d: Decision | None, pack: Pack, digest: str) -> dict[str, Any]:
    """The §8 contract object for one deployment (an ``id`` key when the input had one)."""
    if d is not None:
        out = d.to_json()
    else:
        out = {
            "runner": None,
            "mode": None,
            "family": None,
            "stage": None,
            "canary": None,
            "reasons": [],
            "messages": [],
            "reason_code": "ERROR",
            "error": item.error,
            "error_code": item.error_code,
            "policy_digest": digest,
            "pack": pack.name,
        }
    return {"id": item.id, **out} if item.id is not None else out


def input_error_json(exc: OracleError, pack: Pack | None) -> dict[str, Any]:
    """The contract object for input that could not be read at all (a spec file that is not
    YAML, an unknown pack, a bad canary snapshot): no decision, ``error`` says why."""
    return {
        "runner": None,
        "mode": None,
        "family": None,
        "stage": None,
        "canary": None,
        "reasons": [],
        "messages": [],
        "reason_code": "ERROR",
        "error": exc.message,
        "error_code": exc.code,
        "policy_digest": pack.policy_digest() if pack else None,
        "pack": pack.name if pack else None,
    }


def print_json(results: Sequence[tuple[Item, Decision | None]], pack: Pack, digest: str) -> None:
    for item, d in results:
        print(json.dumps(result_json(item, d, pack, digest), sort_keys=False))


def _runner_text(d: Decision | None) -> str:
    if d is None:
        return "[red]bad input[/]"
    if d.runner is None:
        return "[red]none (error)[/]"
    color = "green" if d.runner == "v2" else "yellow"
    return f"[{color}]{d.runner.upper()}[/]"


def print_one(console: Console, item: Item, d: Decision | None) -> None:
    if d is None:
        console.print(
            f"[red]error[/] ({item.error_code}): {escape(item.error or '')}", highlight=False
        )
        return
    console.print(
        f"runner {_runner_text(d)}  mode {d.mode}  reason {d.reason_code}  "
        f"family {escape(d.family or '-')}  stage {escape(d.stage or '-')}  "
        f"pack {escape(d.pack)}"
    )
    lines = [(Text(f"  {m.level}"), Text(m.message)) for m in d.messages]
    if d.error:
        lines.append((Text("  error", style="red"), Text(f"({d.error_code}): {d.error}")))
    if lines:
        console.print(hanging(lines))
    if d.reasons:
        console.print(_reasons_table(console, d))
    if item.model_source:
        console.print(
            hanging([(Text("  model config", style="dim"), Text(item.model_source, style="dim"))])
        )
    console.print(f"  policy digest {d.policy_digest}", style="dim")


def hanging(lines: Sequence[tuple[Text, Text]]) -> Table:
    """Lines of ``head text`` whose text, when it wraps, continues under its own start."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for head, text in lines:
        text.overflow = "fold"
        grid.add_row(head, text)
    return grid


def _reasons_table(console: Console, d: Decision) -> Table:
    rows = [
        (r.rule_id, r.label, r.severity, ", ".join(f"{k}={v!r}" for k, v in r.matched.items()))
        for r in d.reasons
    ]
    table = folding_table("rule", "label", "severity", "matched", box=None, pad_edge=False)
    # Keep rule ids and matched values whole on their line when the terminal has room for
    # them: an 80-column terminal folded 'ngram' and left its closing quote alone on the next
    # line. The label, prose, wraps in the room left; with less room than that, every cell
    # folds. (Widths are set here: Rich does not take a column's min_width out of the others
    # and crops the row instead.)
    headers = [str(column.header) for column in table.columns]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(4)]
    room = console.width - 2 * (len(widths) - 1) - widths[0] - widths[2] - widths[3]
    if room >= min(widths[1], len("label") + 3):
        widths[1] = min(widths[1], room)
        for column, width in zip(table.columns, widths, strict=True):
            column.width = width
    for row in rows:
        table.add_row(*(Text(cell, overflow="fold") for cell in row))
    return table


def print_canaries(console: Console, canaries: Canaries, *, markdown: bool = False) -> None:
    """The line that says which canaries the results above were decided with."""
    if markdown:
        print(f"\ncanaries: {canaries.source}")
    else:
        console.print(hanging([(Text("canaries:"), Text(canaries.source))]))


def print_many(console: Console, results: Sequence[tuple[Item, Decision | None]]) -> None:
    table = folding_table("id", "model", "family", "runner", "reason", "top reason")
    for item, d in results:
        top = (d.reasons[0].label if d and d.reasons else "") if d else (item.error or "")
        table.add_row(
            escape(item.id or "-"),
            escape(item.model or "-"),
            escape(d.family or "-" if d else "-"),
            _runner_text(d),
            escape(d.reason_code if d else item.error_code or ""),
            escape(top),
        )
    console.print(table)


def summary_rows(results: Sequence[tuple[Item, Decision | None]], pack: Pack) -> list[list[str]]:
    """Per family: deployments, V2, V1, no runner, top reasons (rule id x count, the three
    most common). The "(bad input)" row names every error code with its count: its lines are
    the ones to fix, and a few codes (unknown_model, unknown_flag, placeholder_model, ...) say
    what to fix in each."""
    groups: dict[str, list[Decision | None]] = defaultdict(list)
    errors: Counter[str] = Counter()
    for item, d in results:
        if d is None or d.error_code == ErrorCode.UNKNOWN_ARCHITECTURE:
            groups["(bad input)"].append(None)
            errors[(d.error_code if d else item.error_code) or "bad_input"] += 1
        else:
            groups[d.family or "(none)"].append(d)
    labels = pack.families
    rows = []
    for fam in sorted(groups, key=lambda f: (-len(groups[f]), f)):
        ds = groups[fam]
        decided = [d for d in ds if d is not None]
        reasons: Counter[str] = Counter(r.rule_id for d in decided for r in d.reasons)
        top, num_top = (errors, None) if fam == "(bad input)" else (reasons, 3)
        rows.append(
            [
                labels.get(fam, fam),
                str(len(ds)),
                str(sum(d.runner == "v2" for d in decided)),
                str(sum(d.runner == "v1" for d in decided)),
                str(sum(d.runner is None for d in decided)),
                ", ".join(f"{k} ({n})" for k, n in top.most_common(num_top)),
            ]
        )
    return rows


SUMMARY_HEADER = ["family", "deployments", "V2", "V1", "no runner", "top reasons"]


def print_summary(
    console: Console, results: Sequence[tuple[Item, Decision | None]], pack: Pack, markdown: bool
) -> None:
    rows = summary_rows(results, pack)
    if markdown:
        print("| " + " | ".join(SUMMARY_HEADER) + " |")
        print("|" + "---|" * len(SUMMARY_HEADER))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    table = folding_table(
        *SUMMARY_HEADER, title=escape(f"{len(results)} deployments, pack {pack.name}")
    )
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
