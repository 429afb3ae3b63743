"""``turnout engines`` (the live engines and the ones still on an old decision) and ``turnout
audit`` (who changed what, newest first), read through the service's API
(``cli_base.service``) with any token (viewer and up)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from turnout.dashboard.cli_base import ContextOpt, parse_time, resolve_cohort, service

JsonOpt = Annotated[bool, typer.Option("--json", help="the API's answer as JSON")]


def engine_line(e: dict[str, Any]) -> str:
    """One engine: where it answers, what it runs, and whether a restart would change that."""
    runs = f"{e['runner']}"
    if e["stale"]:
        runs += f" (a restart gives {e['expected_runner']}: STALE)"
    return (
        f"{e['address']}  {e['deployment_id']}  {e['family']}  stage {e['stage'] or '-'} "
        f"({e['cohort']})  runs {runs}  {e['engine']} vllm {e['vllm_version']}  "
        f"seen {e['last_seen_s_ago']:.0f} s ago"
    )


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
    params: dict[str, Any] = {"stage": stage, "stale": "true" if stale else None}
    with service(context) as api:
        body = api.get("/engines", params).body
    if as_json:
        typer.echo(json.dumps(body, indent=1))
        return
    for e in body["engines"]:
        typer.echo(engine_line(e))
    typer.echo(
        f"{body['num_engines']} engine(s), {body['num_stale']} on an old decision "
        f"(restart them to apply it); an engine leaves the list {body['ttl_s']:.0f} s after "
        "its last heartbeat"
    )


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
        if target is not None and ":" not in target and target != "kill-switch":
            target = f"cohort:{resolve_cohort(api, target)}"
        rows = api.get("/audit", {"limit": limit, "target": target}).body
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        typer.echo("no audit entry" + (f" for {target}" if target else ""))
    for r in rows:
        typer.echo(
            f"{r['id']}  {parse_time(r['at']):%Y-%m-%d %H:%M:%S}  {r['actor']}  {r['action']} "
            f"{r['target']}: {r['reason']}"
        )


def register(app: typer.Typer) -> None:
    app.command("engines")(engines)
    app.command("audit")(audit)
