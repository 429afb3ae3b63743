"""``turnout decide``: the runner for a ``vllm serve`` line, a spec file or a commands file."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from turnout.oracle.cli.canaries import Canaries, load_canaries
from turnout.oracle.cli.console import make_console
from turnout.oracle.cli.inputs import (
    Item,
    Overrides,
    from_command_line,
    from_commands_file,
    from_keywords,
    from_spec_file,
)
from turnout.oracle.cli.render import (
    EXIT_BAD_INPUT,
    exit_code,
    input_error_json,
    print_canaries,
    print_json,
    print_many,
    print_one,
    print_summary,
)
from turnout.oracle.decision import CanarySnapshot, Decision
from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.pack import Pack, load_pack
from turnout.oracle.sources import release_for_pack

PackOpt = Annotated[str, typer.Option("--pack", "-p", help="pack name or folder")]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object per deployment")]
ArchOpt = Annotated[str | None, typer.Option("--architecture", help="HF architecture")]
HfOpt = Annotated[Path | None, typer.Option("--config", help="a local HF config.json")]
PlatOpt = Annotated[str | None, typer.Option("--platform", help="cuda, rocm, cpu, xpu, tpu")]
IdOpt = Annotated[str | None, typer.Option("--deployment-id", help="for percentage canaries")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", help="NAME=VALUE (repeatable)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="FIELD=VALUE (repeatable)")]
CanOpt = Annotated[
    Path | None,
    typer.Option(
        "--canaries",
        help="canary snapshot JSON (the service's GET /api/v1/canaries body); "
        "default: the pack's rollout.yaml defaults",
    ),
]
Argv = Annotated[list[str] | None, typer.Argument(help="-- vllm serve MODEL [flags]")]


def gather(
    argv: list[str] | None, spec: Path | None, commands: Path | None, ov: Overrides
) -> list[Item]:
    """The deployments the options describe (exactly one input form)."""
    forms = [x for x in (argv, spec, commands) if x]
    if len(forms) > 1:
        raise OracleError(
            "give one of: a command line after --, --spec FILE, --commands FILE",
            code=ErrorCode.BAD_USAGE,
        )
    if argv:
        return [from_command_line(argv, ov)]
    if spec is not None:
        return from_spec_file(spec, ov)
    if commands is not None:
        return from_commands_file(commands, ov)
    if ov.architecture is None and ov.hf_config is None and not ov.sets:
        raise OracleError(
            "nothing to decide: pass -- vllm serve MODEL ..., --spec FILE, "
            "--commands FILE, or --architecture/--config",
            code=ErrorCode.BAD_USAGE,
        )
    return [from_keywords(ov)]


def prepare(
    console: Console,
    pack: str,
    canaries: Path | None,
    argv: list[str] | None,
    spec: Path | None,
    commands: Path | None,
    ov: Overrides,
    *,
    as_json: bool = False,
    wrap: Callable[[dict[str, Any]], dict[str, Any]] = lambda d: d,
) -> tuple[Pack, Canaries, list[Item]]:
    """The pack, the canaries and the deployments; bad input exits 2 with the reason
    (and, with ``as_json``, one contract object whose ``error`` says it on stdout, passed
    through ``wrap`` first)."""
    the_pack: Pack | None = None
    try:
        the_pack = load_pack(pack)
        ov = dataclasses.replace(ov, release=release_for_pack(the_pack))
        return the_pack, load_canaries(canaries, the_pack), gather(argv, spec, commands, ov)
    except OracleError as exc:
        if as_json:
            print(json.dumps(wrap(input_error_json(exc, the_pack))))
        raise fail(console, exc) from None


def run_decisions(
    items: list[Item], pack: Pack, canaries: CanarySnapshot | None
) -> list[tuple[Item, Decision | None]]:
    return [(i, pack.decide(i.config, canaries) if i.config is not None else None) for i in items]


def fail(console: Console, exc: OracleError) -> typer.Exit:
    console.print(f"[red]error[/] ({exc.code}): {escape(exc.message)}", highlight=False)
    return typer.Exit(EXIT_BAD_INPUT)


def decide(
    argv: Argv = None,
    pack: PackOpt = "turnout",
    spec: Annotated[Path | None, typer.Option("--spec", help="YAML/JSON/JSONL spec")] = None,
    commands: Annotated[
        Path | None,
        typer.Option(
            "--commands",
            help="one deployment a line: JSON {id, env, argv}, or a shell "
            "line (NAME=value ... vllm serve MODEL ...)",
        ),
    ] = None,
    as_json: JsonOpt = False,
    architecture: ArchOpt = None,
    hf_config: HfOpt = None,
    platform: PlatOpt = None,
    deployment_id: IdOpt = None,
    env: EnvOpt = None,
    sets: SetOpt = None,
    canaries: CanOpt = None,
    summary: Annotated[bool, typer.Option("--summary", help="table per family")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="summary as Markdown")] = False,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare",
            help="another pack (an upgrade: --pack vllm-0.31 --compare vllm-0.32): "
            "the deployments whose runner changes and why; exit 1 if any do",
        ),
    ] = None,
) -> None:
    """Decide the runner. Exit 0 decided, 2 bad input, 3 no runner can serve it (a pin that
    cannot be honoured, an architecture no runner of this build serves). With --compare: 0 no
    runner changes, 1 some do, 2 the input cannot be read."""
    console = make_console(stderr=as_json)
    ov = Overrides(
        architecture, hf_config, platform, deployment_id, tuple(env or ()), tuple(sets or ())
    )
    the_pack, used, items = prepare(
        console, pack, canaries, argv, spec, commands, ov, as_json=as_json
    )
    if compare is not None:
        _compare(
            console,
            the_pack,
            compare,
            used,
            items,
            as_json=as_json,
            summary_only=summary,
            markdown=markdown,
            regather=lambda o: gather(argv, spec, commands, o),
            ov=ov,
        )
    results = run_decisions(items, the_pack, used.snapshot)
    if as_json:
        print_json(results, the_pack, the_pack.policy_digest(used.snapshot))
        raise typer.Exit(exit_code(results))
    if summary:
        print_summary(console, results, the_pack, markdown)
    elif len(results) == 1 and spec is None and commands is None:
        print_one(console, *results[0])
    else:
        print_many(console, results)
    print_canaries(console, used, markdown=summary and markdown)
    raise typer.Exit(exit_code(results))


def _compare(
    console: Console,
    the_pack: Pack,
    other: str,
    used: Canaries,
    items: list[Item],
    *,
    as_json: bool,
    summary_only: bool,
    markdown: bool,
    regather: Callable[[Overrides], list[Item]],
    ov: Overrides,
) -> None:
    """``--compare``: print the comparison and exit with its status. Command lines are read
    again by ``other``'s release when its parser differs (``regather``)."""
    from turnout.oracle.cli.compare_cmd import (
        compare_items,
        exit_status,
        print_compare,
        print_compare_json,
    )

    try:
        after = load_pack(other)
    except OracleError as exc:
        if as_json:
            print(json.dumps(input_error_json(exc, None)))
        raise fail(console, exc) from None
    after_release = release_for_pack(after)
    after_items = None
    if after_release != release_for_pack(the_pack):
        try:
            after_items = regather(dataclasses.replace(ov, release=after_release))
        except OracleError as exc:  # a whole input the other release cannot take
            raise fail(console, exc) from None
    changes = compare_items(items, the_pack, after, used.snapshot, after_items)
    if as_json:
        print_compare_json(changes, the_pack, after)
    else:
        print_compare(
            console, changes, the_pack, after, summary_only=summary_only, markdown=markdown
        )
        print_canaries(console, used, markdown=markdown)
    raise typer.Exit(exit_status(changes))
