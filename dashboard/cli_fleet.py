"""``turnout engines`` (the live engines and the ones still on an old decision) and ``turnout
audit`` (who changed what, newest first), read through the service's API
(``cli_base.service``) with any token (viewer and up)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.dashboard.cli_base import (
    BAD_INPUT,
    ContextOpt,
    fail,
    parse_time,
    resolve_cohort,
    service,
    stages,
)

if TYPE_CHECKING:
    from turnout.dashboard.remote import Remote

JsonOpt = Annotated[bool, typer.Option("--json", help="the API's answer as JSON")]


def engine_line(e: dict[str, Any]) -> str:
    """One engine: where it answers, what it runs, and whether a restart would change that."""
    runs = f"{e['runner']}"
    if e["stale"]:
        runs += f" (a restart gives {e['expected_runner']}: STALE)"
    return (
        f"{e['address']}  {e['deployment_id']}  {e['family']}  stage {e['stage'] or '-'} "
        f"({e['cohort']})  runs {runs}  {_engine_kind(e)}  "
        f"seen {e['last_seen_s_ago']:.0f} s ago"
    )


def _engine_kind(e: dict[str, Any]) -> str:
    if e["engine"] == "vllm":
        return f"vllm {e['vllm_version']}"
    return f"{e['engine']} (vLLM {e['vllm_version']} metrics)"


def engines(
    stage: Annotated[str | None, typer.Option(help="one stage's engines (its cohort id)")] = None,
    stale: Annotated[
        bool,
        typer.Option("--stale", help="only engines whose runner a restart would change"),
    ] = False,
    as_json: JsonOpt = False,
    context: ContextOpt = None,
) -> None:
    """The live engines (registered, heartbeat within TURNOUT_ENGINE_TTL_S), each with the
    runner it runs and the one a restart would give it under the current canaries."""
    with service(context) as api:
        if stage is not None:
            stage = _known_stage(api, stage)
        params: dict[str, Any] = {"stage": stage, "stale": "true" if stale else None}
        body = api.get("/engines", params).body
        where = api.target.url
    if as_json:
        typer.echo(json.dumps(body, indent=1))
        return
    try:
        lines = [engine_line(e) for e in body["engines"]]
        total = (
            f"{body['num_engines']} engine(s), {body['num_stale']} on an old decision "
            f"(restart them to apply it); an engine leaves the list {body['ttl_s']:.0f} s "
            "after its last heartbeat"
        )
    except (KeyError, TypeError, ValueError):
        raise _not_the_service(where, "/engines") from None
    for line in lines:
        typer.echo(line)
    typer.echo(total)


def audit(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="how many entries")] = 20,
    target: Annotated[
        str | None,
        typer.Option(
            help="one target's entries: a stage (cohort id or family name: its flips, "
            "ramps and scheduled flips), kill-switch, token:ID or webhook:ID"
        ),
    ] = None,
    as_json: JsonOpt = False,
    context: ContextOpt = None,
) -> None:
    """The audit log, newest first: when, who (the token's holder), what and why."""
    with service(context) as api:
        if target is not None:
            target = _audit_target(api, target)
        rows = api.get("/audit", {"limit": limit, "target": target}).body
        where = api.target.url
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    try:
        lines = [
            f"{r['id']}  {parse_time(r['at']):%Y-%m-%d %H:%M:%S}  {r['actor']}  {r['action']} "
            f"{r['target']}: {r['reason']}"
            for r in rows
        ]
    except (KeyError, TypeError, ValueError):
        raise _not_the_service(where, "/audit") from None
    if not lines:
        typer.echo("no audit entry" + (f" for {target}" if target else ""))
    for line in lines:
        typer.echo(line)


_KINDS = ("token", "webhook", "cohort")


def _audit_target(api: Remote, target: str) -> str:
    """``kill-switch``, ``token:ID``, ``webhook:ID``, ``cohort:ID``, or a stage or family name
    (its ``cohort:`` target). Ends the command (bad input) for anything else."""
    if target == "kill-switch":
        return target
    kind, colon, rest = target.partition(":")
    if not colon:
        return f"cohort:{_known_stage(api, target)}"
    if kind not in _KINDS or not rest:
        raise fail(
            f"--target {target!r}: a stage or family name, kill-switch, token:ID, webhook:ID "
            "or cohort:ID",
            BAD_INPUT,
        )
    if kind == "cohort":
        return f"cohort:{_known_stage(api, rest)}"
    if not rest.isdigit():
        raise fail(f"--target {target!r}: {kind}:ID takes a number", BAD_INPUT)
    return target


def _known_stage(api: Remote, name: str) -> str:
    """A stage of the service's pack from a cohort id or a family name; ends the command
    (bad input, the stages listed) for any other name."""
    cohort = resolve_cohort(api, name)
    known = [str(s.get("cohort")) for s in stages(api) if isinstance(s, dict)]
    if cohort not in known:
        raise fail(f"{name!r} is no stage or family; the stages: {', '.join(known)}", BAD_INPUT)
    return cohort


def _not_the_service(url: str, path: str) -> typer.Exit:
    return fail(f"GET {path} of {url} answered JSON of another shape: is it the turnout service?")


def register(app: typer.Typer) -> None:
    app.command("engines")(engines)
    app.command("audit")(audit)
