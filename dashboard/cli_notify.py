"""``turnout webhook …`` (subscriptions and the outbox; admin) and ``turnout evidence push``
(a CI job's JUnit report recorded as a family's parity evidence; operator), through the
service's API (``cli_base.service``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnout.dashboard.cli_base import (
    BAD_INPUT,
    ContextOpt,
    ReasonOpt,
    ServiceOnlyOpt,
    check_reason,
    fail,
    service,
)

webhook_app = typer.Typer(
    help="Webhook subscriptions and their outbox (signed deliveries; admin).", no_args_is_help=True
)
evidence_app = typer.Typer(help="Parity evidence per family.", no_args_is_help=True)
IdArg = Annotated[int, typer.Argument(min=1, max=2**63 - 1)]


@webhook_app.command("add")
def webhook_add(
    url: Annotated[str, typer.Argument(help="http:// or https:// URL the events are POSTed to")],
    kind: Annotated[
        list[str],
        typer.Option(
            "--kind",
            "-k",
            help="flip, ramp_step, gate_failure, kill_switch, scheduled_flip, "
            "approval (repeat; default: every kind)",
        ),
    ] = [],  # noqa: B006 - typer's list option
    secret: Annotated[str | None, typer.Option(help="HMAC key (default: a new random one)")] = None,
    description: Annotated[str, typer.Option()] = "",
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Subscribe a URL; prints the secret once (the receiver verifies signatures with it)."""
    from turnout.dashboard.store import webhooks

    body = {
        "url": url,
        "kinds": kind or [k.value for k in webhooks.Kind],
        "secret": secret,
        "description": description,
    }
    with service(context, database_url) as api:
        row = api.post("/webhooks", body).body
    typer.echo(row["secret"])
    typer.echo(
        f"(webhook {row['id']}: {', '.join(row['kinds'])} to {row['url']}; secret shown once)",
        err=True,
    )


@webhook_app.command("list")
def webhook_list(context: ContextOpt = None, database_url: ServiceOnlyOpt = None) -> None:
    """Live subscriptions and the outbox's counts."""
    with service(context, database_url) as api:
        rows = api.get("/webhooks").body
        counts = api.get("/webhooks/outbox", {"limit": 1}).body["counts"]
    for w in rows:
        typer.echo(f"{w['id']:>4}  {w['url']}  {', '.join(w['kinds'])}  {w['description']}")
    typer.echo("outbox: " + ", ".join(f"{n} {state}" for state, n in counts.items()))


@webhook_app.command("remove")
def webhook_remove(
    webhook_id: IdArg,
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """End a subscription; its pending deliveries become dead."""
    check_reason(reason)
    with service(context, database_url) as api:
        row = api.post(f"/webhooks/{webhook_id}/remove", {"reason": reason}).body
    typer.echo(f"webhook {row['id']} ({row['url']}) removed")


@webhook_app.command("outbox")
def webhook_outbox(
    state: Annotated[str | None, typer.Option(help="pending | delivered | dead")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """The latest deliveries, newest first, with their attempts and last error."""
    if state not in (None, "pending", "delivered", "dead"):
        raise fail(f"--state {state!r}: use pending, delivered or dead", BAD_INPUT)
    with service(context, database_url) as api:
        rows = api.get("/webhooks/outbox", {"state": state, "limit": limit}).body["entries"]
    for e in rows:
        last = f"{e['last_error'] or e['last_status'] or ''}"
        typer.echo(
            f"{e['id']:>6}  {e['state']:<9}  {e['kind']:<14}  webhook {e['webhook_id']}  "
            f"{e['num_attempts']} attempt(s)  {last}"
        )


@webhook_app.command("retry")
def webhook_retry(
    entry_id: IdArg, context: ContextOpt = None, database_url: ServiceOnlyOpt = None
) -> None:
    """Send a dead delivery again (due now)."""
    with service(context, database_url) as api:
        api.post(f"/webhooks/outbox/{entry_id}/retry", None)
    typer.echo(f"delivery {entry_id}: pending again")


@evidence_app.command("push")
def evidence_push(
    family: Annotated[str, typer.Option(help="the family the run tested (families.yaml)")],
    junit: Annotated[Path, typer.Option(help="the run's JUnit XML report")],
    url: Annotated[
        str | None,
        typer.Option(help="the service (default: TURNOUT_URL, else the current context)"),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="an operator token (default: TURNOUT_TOKEN, or the context's)"),
    ] = None,
    suite: Annotated[str | None, typer.Option(help="default: the report's suite names")] = None,
    runner_pair: Annotated[str, typer.Option(help="v1:v2")] = "v1:v2",
    context: ContextOpt = None,
) -> None:
    """Record a test run as the family's parity evidence (operator): failures or errors (or
    no test at all) make it red; its counts are kept. Exit 0 once recorded, 2 for a report or
    a family the service refuses, 1 when the service cannot be reached or refuses the token."""
    from turnout.dashboard.junit import JUnitError, read_junit

    try:
        run = read_junit(junit)
    except JUnitError as err:
        raise fail(str(err), BAD_INPUT) from None
    body = {
        "family": family,
        "runner_pair": runner_pair,
        "result": run.result,
        "suite": (suite or ", ".join(filter(None, run.suites)) or junit.name)[:128],
        "details": _details(run.summary(), run.failed),
        "num_tests": run.num_tests,
        "num_failures": run.num_failures,
        "num_errors": run.num_errors,
        "num_skipped": run.num_skipped,
    }
    with service(context, url=url, token=token) as api:
        recorded = api.post("/evidence", body).body
    typer.echo(f"{family}: {run.result} ({run.summary()}) recorded as evidence {recorded['id']}")


def _details(summary: str, failed: tuple[str, ...]) -> str:
    """The summary and the failed cases' names, a line each, within the characters evidence
    keeps (parametrized ids can be long: each name is cut, then the whole)."""
    from turnout.dashboard.api.schemas import MAX_EVIDENCE_DETAILS

    text = summary + "".join(f"\n{name[:500]}" for name in failed)
    return text if len(text) <= MAX_EVIDENCE_DETAILS else text[: MAX_EVIDENCE_DETAILS - 1] + "…"


def register(app: typer.Typer) -> None:
    app.add_typer(webhook_app, name="webhook")
    app.add_typer(evidence_app, name="evidence")
