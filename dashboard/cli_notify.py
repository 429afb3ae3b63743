"""``turnout webhook …`` (subscriptions and the outbox, on the settings' database) and
``turnout evidence push`` (a CI job's JUnit report sent to a running service, with a token)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnout.dashboard.cli import (
    BAD_INPUT,
    DatabaseOpt,
    ReasonOpt,
    _actor,
    _fail,
    _prepared,
    _store_fail,
)

webhook_app = typer.Typer(
    help="Webhook subscriptions and their outbox (signed deliveries).", no_args_is_help=True
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
    database_url: DatabaseOpt = None,
) -> None:
    """Subscribe a URL; prints the secret once (the receiver verifies signatures with it)."""
    from turnout.dashboard.store import webhooks
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            row, made = webhooks.add_webhook(
                session=session,
                url=url,
                kinds=kind or [k.value for k in webhooks.Kind],
                actor=_actor(),
                secret=secret,
                description=description,
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    typer.echo(made)
    typer.echo(
        f"(webhook {row.id}: {', '.join(row.kinds)} to {row.url}; secret shown once)", err=True
    )


@webhook_app.command("list")
def webhook_list(database_url: DatabaseOpt = None) -> None:
    """Live subscriptions and the outbox's counts."""
    from turnout.dashboard.store import webhooks

    services = _prepared(database_url)
    with services.db.read_session() as session:
        rows = webhooks.list_webhooks(session=session)
        counts = webhooks.outbox_counts(session=session)
    for w in rows:
        typer.echo(f"{w.id:>4}  {w.url}  {', '.join(w.kinds)}  {w.description}")
    typer.echo("outbox: " + ", ".join(f"{n} {state}" for state, n in counts.items()))


@webhook_app.command("remove")
def webhook_remove(webhook_id: IdArg, reason: ReasonOpt, database_url: DatabaseOpt = None) -> None:
    """End a subscription; its pending deliveries become dead."""
    from turnout.dashboard.store import webhooks
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            row = webhooks.remove_webhook(
                session=session, webhook_id=webhook_id, actor=_actor(), reason=reason
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    typer.echo(f"webhook {row.id} ({row.url}) removed")


@webhook_app.command("outbox")
def webhook_outbox(
    state: Annotated[str | None, typer.Option(help="pending | delivered | dead")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    database_url: DatabaseOpt = None,
) -> None:
    """The latest deliveries, newest first, with their attempts and last error."""
    from turnout.dashboard.store import webhooks

    if state not in (None, "pending", "delivered", "dead"):
        raise _fail(f"--state {state!r}: use pending, delivered or dead", BAD_INPUT)
    services = _prepared(database_url)
    with services.db.read_session() as session:
        rows = webhooks.list_outbox(session=session, state=state, limit=limit)
    for e in rows:
        last = f"{e.last_error or e.last_status or ''}"
        typer.echo(
            f"{e.id:>6}  {e.state:<9}  {e.kind:<14}  webhook {e.webhook_id}  "
            f"{e.num_attempts} attempt(s)  {last}"
        )


@webhook_app.command("retry")
def webhook_retry(entry_id: IdArg, database_url: DatabaseOpt = None) -> None:
    """Send a dead delivery again (due now)."""
    from turnout.dashboard.store import webhooks
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            webhooks.retry_dead(session=session, entry_id=entry_id, actor=_actor())
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    typer.echo(f"delivery {entry_id}: pending again")


@evidence_app.command("push")
def evidence_push(
    family: Annotated[str, typer.Option(help="the family the run tested (families.yaml)")],
    junit: Annotated[Path, typer.Option(help="the run's JUnit XML report")],
    url: Annotated[
        str, typer.Option(envvar="TURNOUT_URL", help="the service")
    ] = "http://127.0.0.1:8000",
    token: Annotated[
        str | None, typer.Option(envvar="TURNOUT_TOKEN", help="an operator token")
    ] = None,
    suite: Annotated[str | None, typer.Option(help="default: the report's suite names")] = None,
    runner_pair: Annotated[str, typer.Option(help="v1:v2")] = "v1:v2",
) -> None:
    """Record a test run as the family's parity evidence: failures or errors (or no test at
    all) make it red; its counts are kept. Exit 0 once recorded, 2 for a report or a family
    the service refuses, 1 when the service cannot be reached or refuses the token."""
    import httpx

    from turnout.dashboard.junit import JUnitError, read_junit

    if not token:
        raise _fail("--token (or TURNOUT_TOKEN): an operator token of the service", BAD_INPUT)
    try:
        run = read_junit(junit)
    except JUnitError as err:
        raise _fail(str(err), BAD_INPUT) from None
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
    try:
        r = httpx.post(
            url.rstrip("/") + "/api/v1/evidence",
            json=body,
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
        )
    except httpx.HTTPError as err:
        raise _fail(f"cannot reach the service at {url}: {err}") from None
    if r.status_code != 201:
        message = (
            r.json().get("detail", {}).get("message", r.text)
            if r.headers.get("content-type", "").startswith("application/json")
            else r.text[:200]
        )
        raise _fail(
            f"the service refused the evidence ({r.status_code}): {message}",
            BAD_INPUT if r.status_code == 422 else 1,
        )
    typer.echo(f"{family}: {run.result} ({run.summary()}) recorded as evidence {r.json()['id']}")


def _details(summary: str, failed: tuple[str, ...]) -> str:
    """The summary and the failed cases' names, a line each, within the characters evidence
    keeps (parametrized ids can be long: each name is cut, then the whole)."""
    from turnout.dashboard.api.schemas import MAX_EVIDENCE_DETAILS

    text = summary + "".join(f"\n{name[:500]}" for name in failed)
    return text if len(text) <= MAX_EVIDENCE_DETAILS else text[: MAX_EVIDENCE_DETAILS - 1] + "…"


def register(app: typer.Typer) -> None:
    app.add_typer(webhook_app, name="webhook")
    app.add_typer(evidence_app, name="evidence")
