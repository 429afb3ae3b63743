"""``turnout canary ramp …``, ``turnout canary schedule``, ``turnout approvals …`` and the flip of
``turnout canary enable/disable``, on the database the settings name (audited as
``cli:<user>``, as the other service commands). Heavy imports stay inside the commands."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.dashboard.cli import (
    BAD_INPUT,
    DatabaseOpt,
    PackOpt,
    ReasonOpt,
    _actor,
    _fail,
    _prepared,
    _store_fail,
)

if TYPE_CHECKING:
    from turnout.dashboard.services import Services
    from turnout.dashboard.store.models_rollout import Ramp

ramp_app = typer.Typer(
    help="Ramps: a cohort's share raised step by step while its gates hold.", no_args_is_help=True
)
approvals_app = typer.Typer(
    help="Changes waiting for a second operator (TURNOUT_REQUIRE_APPROVAL).", no_args_is_help=True
)
CohortArg = Annotated[str, typer.Argument(help="cohort id or family name")]


def _cohort(services: Services, cohort: str) -> str:
    resolved = services.policy.resolve_cohort(cohort)
    if resolved != cohort:
        typer.echo(f"{cohort}: the family's first rollout stage is {resolved}")
    return resolved


def flip(
    cohort: str,
    enabled: bool,
    reason: str,
    percentage: int | None,
    database_url: str | None,
    pack: str | None,
) -> None:
    """``turnout canary enable/disable``: a flip now, or with approvals required and more of
    the cohort sent to V2, a request another operator approves."""
    from turnout.dashboard.store import canaries, schedule
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url, pack)
    cohort = _cohort(services, cohort)
    try:
        with services.db.write_session() as session:
            # Locked: the version named below is the one the flip finds (another writer waits).
            current = canaries.get_canary(session=session, cohort=cohort, for_update=True)
            done = schedule.flip_or_request(
                session=session,
                cohort=cohort,
                enabled=enabled,
                reason=reason,
                actor=_actor(),
                requester=_actor(),
                if_version=current.version,
                percentage=percentage,
                require_approval=services.require_approval(),
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(services.policy.store_error_text(cohort, err), err) from err
    if not isinstance(done, canaries.Flip):
        typer.echo(
            f"{cohort}: waiting for another operator's approval (flip {done.id}: "
            f"turnout approvals approve flip {done.id} --reason …)"
        )
        return
    row = done.canary
    state = f"enabled at {row.percentage}%" if row.enabled else "disabled"
    if done.changed:
        typer.echo(f"{cohort}: {state} (version {row.version})")
    else:
        typer.echo(f"{cohort}: already {state}; nothing changed (version {row.version})")


def parse_steps(text: str, bake: dt.timedelta) -> list[dict[str, int]]:
    """``10,25:1h,50,100`` → steps, each baking ``bake`` unless it names its own.
    Raises typer.Exit (bad input) for what does not read."""
    from turnout.dashboard.store import tokens
    from turnout.dashboard.store.errors import StoreError

    steps = []
    for part in text.split(","):
        share, _, own = part.strip().partition(":")
        if not (share.isascii() and share.isdigit()):
            raise _fail(f"--steps: {part.strip()!r} is not a share (10, or 10:30m)", BAD_INPUT)
        try:
            span = tokens.read_duration(own) if own else bake
        except StoreError as err:
            raise _fail(f"--steps {part.strip()!r}: {err}", BAD_INPUT) from None
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
        raise _fail(f"{option} {err}", BAD_INPUT) from None


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
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
) -> None:
    """Start a ramp: its first step applies now (or once approved), the service's ticker takes
    the next ones while every gate holds."""
    from pydantic import ValidationError

    from turnout.dashboard.gates import GateConfig
    from turnout.dashboard.store import canaries, ramps
    from turnout.dashboard.store.errors import StoreError

    parsed = parse_steps(steps, _duration("--bake", bake))
    services = _prepared(database_url, pack)
    cohort = _cohort(services, cohort)
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
    }
    try:
        gates = GateConfig.model_validate(
            {
                **services.settings.ramp_gates.model_dump(),
                **{k: v for k, v in given.items() if v is not None},
            }
        )
    except ValidationError as err:
        raise _fail(
            f"gates: {err.errors()[0]['loc'][0]}: {err.errors()[0]['msg']}", BAD_INPUT
        ) from None
    try:
        with services.db.write_session() as session:
            current = canaries.get_canary(session=session, cohort=cohort, for_update=True)
            ramp = ramps.request_ramp(
                session=session,
                cohort=cohort,
                steps=parsed,
                gates=gates,
                on_failure=on_failure,
                reason=reason,
                actor=_actor(),
                requester=_actor(),
                if_version=current.version,
                needs_approval=services.require_approval(),
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(services.policy.store_error_text(cohort, err), err) from err
    typer.echo(_ramp_line(ramp))


def _ramp_line(ramp: Ramp) -> str:
    from turnout.dashboard.store import ramps

    shares = " → ".join(f"{s['percentage']}%" for s in ramp.steps)
    head = f"ramp {ramp.id} of {ramp.cohort} ({shares}): {ramp.state}"
    if ramp.state == ramps.RampState.pending_approval:
        return head + (
            f"; waiting for another operator (turnout approvals approve ramp {ramp.id} --reason …)"
        )
    if ramp.state in (ramps.RampState.active, ramps.RampState.paused):
        share = ramp.steps[ramp.step_index]["percentage"]
        head += f" at {share}% (step {ramp.step_index + 1}/{len(ramp.steps)})"
        if ramp.state == ramps.RampState.paused:  # no step comes until it is resumed
            return head + (
                f"; stays there until resumed (turnout canary ramp resume {ramp.cohort} --reason …)"
            )
        due = ramps.next_step_at(ramp)
        return head + (f", next step {due:%Y-%m-%d %H:%M} UTC if every gate passes" if due else "")
    return head + (f": {ramp.end_reason}" if ramp.end_reason else "")


@ramp_app.command("status")
def ramp_status(
    cohort: Annotated[
        str | None, typer.Argument(help="cohort id or family name (default: every live ramp)")
    ] = None,
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
) -> None:
    """Live ramps (or a cohort's latest one) and each gate's last result."""
    from turnout.dashboard.store import ramps

    services = _prepared(database_url, pack)
    with services.db.read_session() as session:
        rows = (
            ramps.list_ramps(session=session, cohort=_cohort(services, cohort), limit=1)
            if cohort
            else ramps.list_ramps(session=session, live_only=True)
        )
    if not rows:
        typer.echo("no live ramp" if cohort is None else f"{cohort}: no ramp")
    for ramp in rows:
        typer.echo(_ramp_line(ramp))
        for gate in ramp.last_gates or []:
            typer.echo(f"  {gate['status']:<4}  {gate['message']}")


def _live(services: Services, cohort: str) -> tuple[int, int]:
    from turnout.dashboard.store import ramps

    with services.db.read_session() as session:
        ramp = ramps.live_ramp(session=session, cohort=cohort)
    if ramp is None:
        raise _fail(f"{cohort}: no live ramp", BAD_INPUT)
    return ramp.id, ramp.version


def _change(
    what: str, cohort: str, reason: str, database_url: str | None, pack: str | None
) -> None:
    from turnout.dashboard.store import ramps
    from turnout.dashboard.store.errors import StoreError

    services = _prepared(database_url, pack)
    ramp_id, version = _live(services, _cohort(services, cohort))
    change = ramps.cancel_ramp if what == "cancel" else ramps.resume_ramp
    try:
        with services.db.write_session() as session:
            ramp = change(
                session=session, ramp_id=ramp_id, actor=_actor(), reason=reason, if_version=version
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    typer.echo(_ramp_line(ramp))


@ramp_app.command("cancel")
def ramp_cancel(
    cohort: CohortArg, reason: ReasonOpt, database_url: DatabaseOpt = None, pack: PackOpt = None
) -> None:
    """End the cohort's live ramp; the cohort keeps the share it has now."""
    _change("cancel", cohort, reason, database_url, pack)


@ramp_app.command("resume")
def ramp_resume(
    cohort: CohortArg, reason: ReasonOpt, database_url: DatabaseOpt = None, pack: PackOpt = None
) -> None:
    """Resume the cohort's paused ramp: its step bakes again from now."""
    _change("resume", cohort, reason, database_url, pack)


def _when(at: str | None, in_: str | None) -> dt.datetime:
    """The time of ``--at`` or ``--in`` (one of them). Raises typer.Exit (bad input)."""
    if (at is None) == (in_ is None):
        raise _fail("give --at TIME or --in DURATION", BAD_INPUT)
    if in_ is not None:
        span = _duration("--in", in_)
        if not span:
            raise _fail(
                f"--in {in_!r}: a flip is scheduled more than 0 s ahead (a flip for "
                "now: turnout canary enable/disable)",
                BAD_INPUT,
            )
        return dt.datetime.now(dt.UTC) + span
    assert at is not None
    try:
        when = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        raise _fail(f"--at {at!r} is not a time (2026-12-07T09:00Z)", BAD_INPUT) from None
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
    database_url: DatabaseOpt = None,
    pack: PackOpt = None,
) -> None:
    """Flip a cohort's canary at a given time (an enable waits for approval first when the
    service requires approvals)."""
    from turnout.dashboard.store import schedule
    from turnout.dashboard.store.errors import StoreError

    when = _when(at, in_)
    services = _prepared(database_url, pack)
    cohort = _cohort(services, cohort)
    try:
        with services.db.write_session() as session:
            flip = schedule.request_flip(
                session=session,
                cohort=cohort,
                enabled=enable,
                percentage=percentage,
                reason=reason,
                actor=_actor(),
                requester=_actor(),
                run_at=when,
                if_version=None,
                needs_approval=services.require_approval() and enable,
            )
            session.commit()
    except StoreError as err:
        raise _store_fail(services.policy.store_error_text(cohort, err), err) from err
    share = f" {percentage}%" if percentage is not None else ""
    waits = (
        f"; waiting for another operator (turnout approvals approve flip {flip.id} --reason …)"
        if flip.state == schedule.FlipState.pending_approval
        else ""
    )
    typer.echo(
        f"flip {flip.id}: {cohort} {'enable' if enable else 'disable'}{share} at "
        f"{when.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC ({flip.state}{waits})"
    )


@approvals_app.command("list")
def approvals_list(database_url: DatabaseOpt = None) -> None:
    """Changes waiting for approval, oldest first."""
    from turnout.dashboard.store import approvals

    services = _prepared(database_url)
    with services.db.read_session() as session:
        pending = approvals.list_pending(session=session)
    if not pending:
        typer.echo("nothing waits for approval")
    for p in pending:
        typer.echo(
            f"{p.subject} {p.id}  {p.cohort}: {p.summary}  (by {p.requested_by} at "
            f"{p.requested_at:%Y-%m-%d %H:%M}: {p.reason})"
        )


def _decide(
    decision: str, subject: str, item_id: int, reason: str, database_url: str | None
) -> None:
    from turnout.dashboard.store import approvals
    from turnout.dashboard.store.errors import StoreError

    if subject not in ("ramp", "flip"):
        raise _fail(f"{subject!r}: approve a ramp or a flip", BAD_INPUT)
    services = _prepared(database_url)
    try:
        with services.db.write_session() as session:
            if decision == "approve":
                approvals.approve(
                    session=session,
                    subject=subject,  # type: ignore[arg-type]
                    item_id=item_id,
                    actor=_actor(),
                    approver=_actor(),
                    reason=reason,
                )
            else:
                approvals.reject(
                    session=session,
                    subject=subject,  # type: ignore[arg-type]
                    item_id=item_id,
                    actor=_actor(),
                    reason=reason,
                )
            session.commit()
    except StoreError as err:
        raise _store_fail(str(err), err) from err
    typer.echo(f"{subject} {item_id}: {decision.rstrip('e')}ed")


IdArg = Annotated[int, typer.Argument(min=1, max=2**63 - 1)]
SubjectArg = Annotated[str, typer.Argument(help="ramp | flip")]


@approvals_app.command("approve")
def approvals_approve(
    subject: SubjectArg, item_id: IdArg, reason: ReasonOpt, database_url: DatabaseOpt = None
) -> None:
    """Approve and apply a pending ramp or flip (not your own)."""
    _decide("approve", subject, item_id, reason, database_url)


@approvals_app.command("reject")
def approvals_reject(
    subject: SubjectArg, item_id: IdArg, reason: ReasonOpt, database_url: DatabaseOpt = None
) -> None:
    """Refuse a pending ramp or flip (or withdraw your own)."""
    _decide("reject", subject, item_id, reason, database_url)


def register(app: typer.Typer, canary_app: typer.Typer) -> None:
    canary_app.add_typer(ramp_app, name="ramp")
    canary_app.command("schedule")(schedule_flip)
    app.add_typer(approvals_app, name="approvals")
