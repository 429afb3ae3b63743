"""``turnout canary ramp …``, ``turnout canary schedule`` and ``turnout approvals …``, through
the service's API as the token's holder (``cli_base.service``): an approval's approver is the
token's name, so one token cannot request and approve a change, whatever the shell says.
Heavy imports stay inside the commands."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from turnout.dashboard.cli_base import (
    BAD_INPUT,
    ContextOpt,
    ReasonOpt,
    ServiceOnlyOpt,
    check_reason,
    fail,
    parse_time,
    resolve_cohort,
    service,
)
from turnout.dashboard.gates import PromqlGate
from turnout.dashboard.vllm_gates import VLLM_DEFAULT_GATES
from turnout.oracle.wire import error_text

ramp_app = typer.Typer(
    help="Ramps: a cohort's share raised step by step while its gates hold.", no_args_is_help=True
)
approvals_app = typer.Typer(
    help="Changes waiting for a second operator (TURNOUT_REQUIRE_APPROVAL).", no_args_is_help=True
)
CohortArg = Annotated[str, typer.Argument(help="cohort id or family name")]


def parse_steps(text: str, bake: dt.timedelta) -> list[dict[str, int]]:
    """``10,25:1h,50,100`` → steps, each baking ``bake`` unless it names its own.
    Raises typer.Exit (bad input) for what does not read."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    steps = []
    for part in text.split(","):
        share, _, own = part.strip().partition(":")
        if not (share.isascii() and share.isdigit()):
            raise fail(f"--steps: {part.strip()!r} is not a share (10, or 10:30m)", BAD_INPUT)
        try:
            span = tokens.read_duration(own) if own else bake
        except StoreError as err:
            raise fail(f"--steps {part.strip()!r}: {err}", BAD_INPUT) from None
        steps.append({"percentage": int(share), "bake_s": int(span.total_seconds())})
    return steps


def _duration(option: str, text: str) -> dt.timedelta:
    """A span of 0 or more (bake times may be 0; the store bounds each use). Raises
    typer.Exit (bad input)."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    try:
        return tokens.read_duration(text)
    except StoreError as err:
        raise fail(f"{option} {err}", BAD_INPUT) from None


@ramp_app.command("start")
def ramp_start(
    cohort: CohortArg,
    reason: ReasonOpt,
    steps: Annotated[
        str,
        typer.Option(
            help="shares in order, each with its own bake time "
            "if given: 10,25,50,100 or 10:1h,50,100"
        ),
    ],
    bake: Annotated[str, typer.Option(help="bake time of each step (30m, 2h, 1d)")] = "30m",
    on_failure: Annotated[str, typer.Option(help="pause | rollback")] = "pause",
    min_engines: Annotated[int | None, typer.Option(min=1)] = None,
    max_error_rate_ratio: Annotated[float | None, typer.Option(min=1.0)] = None,
    max_crash_rate: Annotated[float | None, typer.Option(min=0.0)] = None,
    max_tpot_p99_ratio: Annotated[float | None, typer.Option(min=1.0)] = None,
    evidence_max_age: Annotated[str | None, typer.Option(help="7d, 12h")] = None,
    promql: Annotated[
        str | None,
        typer.Option(
            help="PromQL gates: a YAML or JSON file holding a list of {name, query, "
            "comparison, threshold, window}, or `vllm-defaults` (docs/fleet.md)"
        ),
    ] = None,
    health_reports: Annotated[
        bool | None,
        typer.Option(
            "--health-reports/--no-health-reports",
            help="gate on the engines' health reports too (default: yes)",
        ),
    ] = None,
    max_inconclusive_rounds: Annotated[int | None, typer.Option(min=1)] = None,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Start a ramp (operator): its first step applies now (or once approved), the service's
    ticker takes the next ones while every gate holds. A gate left out takes the service's
    default (TURNOUT_RAMP_GATES)."""
    parsed = parse_steps(steps, _duration("--bake", bake))
    if on_failure not in ("pause", "rollback"):
        raise fail(f"--on-failure {on_failure!r}: use pause or rollback", BAD_INPUT)
    check_reason(reason)
    given: dict[str, Any] = {
        "min_engines": min_engines,
        "max_error_rate_ratio": max_error_rate_ratio,
        "max_crash_rate": max_crash_rate,
        "max_tpot_p99_ratio": max_tpot_p99_ratio,
        "evidence_max_age_s": (
            int(_duration("--evidence-max-age", evidence_max_age).total_seconds())
            if evidence_max_age
            else None
        ),
        "promql": promql_gates(promql) if promql is not None else None,
        "health_reports": health_reports,
        "max_inconclusive_rounds": max_inconclusive_rounds,
    }
    gates = {k: v for k, v in given.items() if v is not None}
    with service(context, database_url) as api:
        cohort = resolve_cohort(api, cohort)
        version = api.get(f"/canaries/{cohort}").version()
        ramp = api.post(
            f"/canaries/{cohort}/ramp",
            {
                "steps": parsed,
                "on_failure": on_failure,
                "reason": reason,
                **({"gates": gates} if gates else {}),
            },
            if_match=version,
        ).body
    typer.echo(ramp_line(ramp))


MAX_GATES_FILE = 1 << 20  # 20 gates of 4,000-character queries fit many times over


def promql_gates(given: str) -> list[dict[str, Any]]:
    """``--promql``: ``vllm-defaults`` (``dashboard.vllm_gates``), or a YAML/JSON file of a list
    of PromQL gates, each checked here as the service checks it.

    Raises:
        typer.Exit: the file cannot be read, is not YAML, or a gate is not one (it names the
            file, and the line where YAML says it).
    """
    if given == "vllm-defaults":
        return [g.model_dump() for g in VLLM_DEFAULT_GATES]
    try:
        with Path(given).open("rb") as f:
            raw = f.read(MAX_GATES_FILE + 1)
        if len(raw) > MAX_GATES_FILE:
            raise fail(f"--promql {given}: over {MAX_GATES_FILE} bytes", BAD_INPUT)
        loaded = yaml.safe_load(raw.decode("utf-8"))
    except OSError as err:
        raise fail(f"--promql {given}: {err.strerror or err}", BAD_INPUT) from None
    except UnicodeDecodeError as err:
        raise fail(f"--promql {given}: not UTF-8 text ({err.reason})", BAD_INPUT) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{given}:{mark.line + 1}" if mark is not None else given
        raise fail(f"--promql {where}: not YAML ({err})", BAD_INPUT) from None
    if not isinstance(loaded, list):
        raise fail(f"--promql {given}: a list of gates, not {type(loaded).__name__}", BAD_INPUT)
    try:
        return [PromqlGate.model_validate(g).model_dump() for g in loaded]
    except ValidationError as err:
        raise fail(f"--promql {given}: {error_text(err)}", BAD_INPUT) from None


def ramp_line(ramp: dict[str, Any]) -> str:
    """A ramp (the API's ``RampOut``) on one line: its shares, its state, what comes next."""
    shares = " → ".join(f"{s['percentage']}%" for s in ramp["steps"])
    head = f"ramp {ramp['id']} of {ramp['cohort']} ({shares}): {ramp['state']}"
    if ramp["state"] == "pending_approval":
        return head + (
            f"; waiting for another operator (turnout approvals approve ramp {ramp['id']} "
            "--reason …)"
        )
    if ramp["state"] in ("active", "paused"):
        head += f" at {ramp['percentage']}% (step {ramp['step_index'] + 1}/{len(ramp['steps'])})"
        if ramp["state"] == "paused":  # no step comes until it is resumed
            return head + (
                f"; stays there until resumed (turnout canary ramp resume {ramp['cohort']} "
                "--reason …)"
            )
        due = ramp["next_step_at"]
        return head + (
            f", next step {parse_time(due):%Y-%m-%d %H:%M} UTC if every gate passes" if due else ""
        )
    return head + (f": {ramp['end_reason']}" if ramp["end_reason"] else "")


@ramp_app.command("status")
def ramp_status(
    cohort: Annotated[
        str | None, typer.Argument(help="cohort id or family name (default: every live ramp)")
    ] = None,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Live ramps (or a cohort's latest one) and each gate's last result."""
    with service(context, database_url) as api:
        if cohort:
            rows = api.get("/ramps", {"cohort": resolve_cohort(api, cohort), "limit": 1}).body
        else:
            rows = api.get("/ramps", {"live": "true"}).body
    if not rows:
        typer.echo("no live ramp" if cohort is None else f"{cohort}: no ramp")
    for ramp in rows:
        typer.echo(ramp_line(ramp))
        for gate in ramp["last_gates"]:
            typer.echo(f"  {gate['status']:<4}  {gate['message']}")


def _change(
    what: str, cohort: str, reason: str, context: str | None, database_url: str | None
) -> None:
    """Cancel or resume the cohort's live ramp, with the version just read as If-Match."""
    check_reason(reason)
    with service(context, database_url) as api:
        cohort = resolve_cohort(api, cohort)
        live = api.get("/ramps", {"cohort": cohort, "live": "true", "limit": 1}).body
        if not live:
            raise fail(f"{cohort}: no live ramp", BAD_INPUT)
        ramp = api.post(
            f"/ramps/{live[0]['id']}/{what}", {"reason": reason}, if_match=live[0]["version"]
        ).body
    typer.echo(ramp_line(ramp))


@ramp_app.command("cancel")
def ramp_cancel(
    cohort: CohortArg,
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """End the cohort's live ramp (operator); the cohort keeps the share it has now."""
    _change("cancel", cohort, reason, context, database_url)


@ramp_app.command("resume")
def ramp_resume(
    cohort: CohortArg,
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Resume the cohort's paused ramp (operator): its step bakes again from now."""
    _change("resume", cohort, reason, context, database_url)


def _when(at: str | None, in_: str | None) -> dt.datetime:
    """The time of ``--at`` or ``--in`` (one of them). Raises typer.Exit (bad input)."""
    if (at is None) == (in_ is None):
        raise fail("give --at TIME or --in DURATION", BAD_INPUT)
    if in_ is not None:
        span = _duration("--in", in_)
        if not span:
            raise fail(
                f"--in {in_!r}: a flip is scheduled more than 0 s ahead (a flip for "
                "now: turnout canary enable/disable)",
                BAD_INPUT,
            )
        return dt.datetime.now(dt.UTC) + span
    assert at is not None
    try:
        when = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        raise fail(f"--at {at!r} is not a time (2026-12-07T09:00Z)", BAD_INPUT) from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def schedule_flip(
    cohort: CohortArg,
    reason: ReasonOpt,
    at: Annotated[
        str | None,
        typer.Option(
            help="when, ISO 8601 with its offset or in UTC: 2026-12-07T09:00Z, 2026-12-07T09:00"
        ),
    ] = None,
    in_: Annotated[str | None, typer.Option("--in", help="or how long from now: 2h, 3d")] = None,
    enable: Annotated[bool, typer.Option("--enable/--disable")] = True,
    percentage: Annotated[int | None, typer.Option(min=0, max=100)] = None,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Flip a cohort's canary at a given time (operator; an enable waits for approval first
    when the service requires approvals)."""
    when = _when(at, in_)
    check_reason(reason)
    with service(context, database_url) as api:
        cohort = resolve_cohort(api, cohort)
        flip = api.post(
            "/scheduled-flips",
            {
                "cohort": cohort,
                "enabled": enable,
                "percentage": percentage,
                "run_at": when.isoformat(),
                "reason": reason,
            },
        ).body
    share = f" {percentage}%" if percentage is not None else ""
    waits = (
        f"; waiting for another operator (turnout approvals approve flip {flip['id']} --reason …)"
        if flip["state"] == "pending_approval"
        else ""
    )
    typer.echo(
        f"flip {flip['id']}: {cohort} {'enable' if enable else 'disable'}{share} at "
        f"{when.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC ({flip['state']}{waits})"
    )


@approvals_app.command("list")
def approvals_list(context: ContextOpt = None, database_url: ServiceOnlyOpt = None) -> None:
    """Changes waiting for approval, oldest first."""
    with service(context, database_url) as api:
        pending = api.get("/approvals").body
    if not pending:
        typer.echo("nothing waits for approval")
    for p in pending:
        typer.echo(
            f"{p['subject']} {p['id']}  {p['cohort']}: {p['summary']}  (by {p['requested_by']} "
            f"at {parse_time(p['requested_at']):%Y-%m-%d %H:%M}: {p['reason']})"
        )


def _decide(
    decision: str,
    subject: str,
    item_id: int,
    reason: str,
    context: str | None,
    database_url: str | None,
) -> None:
    if subject not in ("ramp", "flip"):
        raise fail(f"{subject!r}: approve a ramp or a flip", BAD_INPUT)
    check_reason(reason)
    with service(context, database_url) as api:
        api.post(f"/approvals/{subject}/{item_id}/{decision}", {"reason": reason})
    typer.echo(f"{subject} {item_id}: {decision.rstrip('e')}ed")


IdArg = Annotated[int, typer.Argument(min=1, max=2**63 - 1)]
SubjectArg = Annotated[str, typer.Argument(help="ramp | flip")]


@approvals_app.command("approve")
def approvals_approve(
    subject: SubjectArg,
    item_id: IdArg,
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Approve and apply a pending ramp or flip (operator; not one your token's name
    requested)."""
    _decide("approve", subject, item_id, reason, context, database_url)


@approvals_app.command("reject")
def approvals_reject(
    subject: SubjectArg,
    item_id: IdArg,
    reason: ReasonOpt,
    context: ContextOpt = None,
    database_url: ServiceOnlyOpt = None,
) -> None:
    """Refuse a pending ramp or flip (operator; or withdraw your own)."""
    _decide("reject", subject, item_id, reason, context, database_url)


def extend_canary(canary_app: typer.Typer) -> None:
    """Add ``canary ramp`` and ``canary schedule`` to the ``canary`` group: once, at import
    (``dashboard.cli``). Added in ``register``, every application built (each test's) added
    them again to the one module-level group, and Typer rebuilt hundreds of copies per call."""
    canary_app.add_typer(ramp_app, name="ramp")
    canary_app.command("schedule")(schedule_flip)


def register(app: typer.Typer) -> None:
    app.add_typer(approvals_app, name="approvals")
