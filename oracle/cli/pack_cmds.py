"""``turnout explain``, ``turnout lint`` and ``turnout matrix``."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from turnout.oracle.cli.canaries import load_canaries
from turnout.oracle.cli.compare_cmd import EXIT_CHANGED, EXIT_SAME
from turnout.oracle.cli.console import folding_table, make_console
from turnout.oracle.cli.decide_cmd import (
    ArchOpt,
    Argv,
    CanOpt,
    EnvOpt,
    HfOpt,
    IdOpt,
    JsonOpt,
    PackOpt,
    PlatOpt,
    SetOpt,
    fail,
    prepare,
)
from turnout.oracle.cli.diff_cmd import print_diff
from turnout.oracle.cli.inputs import Overrides
from turnout.oracle.cli.render import (
    EXIT_BAD_INPUT,
    exit_code,
    hanging,
    input_error_json,
    print_canaries,
    print_one,
)
from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.explain import explain as explain_config
from turnout.oracle.lint import lint_pack
from turnout.oracle.matrix import enumerate_matrix
from turnout.oracle.matrix_diff import diff_packs
from turnout.oracle.pack import load_pack


def explain(
    argv: Argv = None,
    pack: PackOpt = "turnout",
    spec: Annotated[Path | None, typer.Option("--spec", help="a spec with one deployment")] = None,
    as_json: JsonOpt = False,
    architecture: ArchOpt = None,
    hf_config: HfOpt = None,
    platform: PlatOpt = None,
    deployment_id: IdOpt = None,
    env: EnvOpt = None,
    sets: SetOpt = None,
    canaries: CanOpt = None,
) -> None:
    """Why a deployment gets its runner, and the smallest changes that would reach V2."""
    console = make_console(stderr=as_json)
    ov = Overrides(
        architecture, hf_config, platform, deployment_id, tuple(env or ()), tuple(sets or ())
    )
    the_pack, used, items = prepare(
        console, pack, canaries, argv, spec, None, ov, as_json=as_json, wrap=_explanation_of_error
    )
    if len(items) != 1 or items[0].config is None:
        bad = [i for i in items if i.config is None]
        msg = bad[0].error if bad else "explain takes exactly one deployment"
        if as_json:
            code = bad[0].error_code if bad else ErrorCode.BAD_USAGE
            err = OracleError(msg or "", code=code or ErrorCode.BAD_SPEC)
            print(json.dumps(_explanation_of_error(input_error_json(err, the_pack))))
        console.print(f"[red]error[/]: {escape(msg or '')}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    ex = explain_config(items[0].config, pack=the_pack, canaries=used.snapshot)
    if as_json:
        print(json.dumps(ex.to_json()))
    else:
        print_one(console, items[0], ex.decision)
        if ex.note:
            console.print(ex.note, highlight=False, markup=False)
        if ex.suggestions:
            console.print(
                hanging(
                    [
                        (
                            Text("  → V2", style="green"),
                            Text(f"({s.kind}, {s.decision.reason_code}): {s}"),
                        )
                        for s in ex.suggestions
                    ]
                )
            )
        print_canaries(console, used)
    raise typer.Exit(exit_code([(items[0], ex.decision)]))


def _explanation_of_error(decision: dict[str, Any]) -> dict[str, Any]:
    """``turnout explain --json``'s object for input that could not be decided."""
    return {
        "decision": decision,
        "note": f"fix the input first: {decision['error']}",
        "suggestions": [],
    }


def lint(
    pack_dir: Annotated[str, typer.Argument(help="pack name or folder")] = "turnout",
) -> None:
    """Check a pack: schema, references, dead or shadowed rules, stages. Exit 1 on errors."""
    try:
        issues = lint_pack(pack_dir)
    except OracleError as exc:
        raise fail(make_console(stderr=True), exc) from None
    for issue in issues:
        print(issue)
    errors = sum(i.severity == "error" for i in issues)
    print(f"{pack_dir}: {errors} error(s), {len(issues) - errors} warning(s)")
    raise typer.Exit(1 if errors else 0)


def matrix(
    other: Annotated[
        list[str] | None,
        typer.Argument(
            help="with --diff A: the pack A is compared with (turnout matrix --diff A B)",
            show_default=False,
        ),
    ] = None,
    pack: Annotated[
        str | None, typer.Option("--pack", "-p", help="pack name or folder (default: turnout)")
    ] = None,
    diff: Annotated[
        str | None, typer.Option("--diff", help="compare: --pack P --diff Q (P to Q) or --diff P Q")
    ] = None,
    canaries: CanOpt = None,
    as_json: JsonOpt = False,
    cells: Annotated[
        bool, typer.Option("--cells", help="with --diff: every changed cell, its reasons and steps")
    ] = False,
) -> None:
    """Every cell of the pack's closed domains, tabulated per family (or, with --diff, the
    cells whose runner changes from one pack to another, with the reasons of both; exit 1 when
    any cell changes, 0 when none does, as ``diff`` and ``decide --compare``)."""
    console = make_console()
    try:
        first, second = _packs_asked(pack, diff, other)
        the_pack = load_pack(first)
        compared = load_pack(second) if second else None
        used = load_canaries(canaries, the_pack)
    except OracleError as exc:
        raise fail(console, exc) from None
    snapshot = used.snapshot
    if compared is not None:
        diff_of = diff_packs(the_pack, compared, snapshot)
        print_diff(console, diff_of, as_json=as_json, cells=cells)
        if not as_json:
            print_canaries(console, used)
        raise typer.Exit(EXIT_CHANGED if diff_of.changes else EXIT_SAME)
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for cell in enumerate_matrix(the_pack, snapshot):
        total += 1
        stats[cell.family][cell.decision.runner or "error"] += 1
        reasons[cell.family].update(
            r.rule_id for r in cell.decision.reasons if not r.rule_id.startswith("pin.")
        )
    if as_json:
        print(
            json.dumps(
                {
                    "pack": the_pack.name,
                    "cells": total,
                    "families": {
                        f: {"runners": dict(stats[f]), "reasons": dict(reasons[f].most_common())}
                        for f in sorted(stats)
                    },
                }
            )
        )
        return
    table = folding_table(
        "family",
        "cells",
        "V2",
        "V1",
        "error",
        "top reasons",
        title=escape(f"{the_pack.name}: {total} cells"),
    )
    labels = the_pack.families
    for fam in sorted(stats):
        s = stats[fam]
        table.add_row(
            escape(labels.get(fam, fam)),
            str(sum(s.values())),
            str(s["v2"]),
            str(s["v1"]),
            str(s["error"]),
            escape(", ".join(f"{k} ({n})" for k, n in reasons[fam].most_common(3))),
        )
    console.print(table)
    print_canaries(console, used)


def _packs_asked(
    pack: str | None, diff: str | None, other: list[str] | None
) -> tuple[str, str | None]:
    """(the pack, the pack it is compared with or None) from ``--pack``, ``--diff`` and the
    argument; OracleError (bad_usage) for a combination that names no clear pair."""
    extra = list(other or ())
    if not extra:
        return pack or "turnout", diff
    if diff is None:
        raise OracleError(
            f"unexpected argument {extra[0]!r}: compare two packs with "
            "--diff FROM TO (or --pack FROM --diff TO)",
            code=ErrorCode.BAD_USAGE,
        )
    if len(extra) > 1 or pack is not None:
        raise OracleError(
            "give two packs: --diff FROM TO, or --pack FROM --diff TO", code=ErrorCode.BAD_USAGE
        )
    return diff, extra[0]
