"""Canary state per rollout cohort and the global kill switch, with optimistic concurrency.

A change names the version it read (the API's ``If-Match``); the row is locked (``SELECT ... FOR
UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), the version compared, bumped, and the
audit entry written in the same transaction: exactly one writer wins per version and every
successful change has exactly one audit entry. A flip to the state the cohort already has, or
engaging a kill switch already engaged (releasing one already released), is no change: the
version stays and nothing is audited (``changed`` is false).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from turnout.dashboard.store import audit, webhooks
from turnout.dashboard.store.errors import InvalidChange, NotFound, VersionConflict
from turnout.dashboard.store.models import Canary, KillSwitch, utcnow
from turnout.oracle.errors import ErrorCode

KILL_SWITCH_ID = 1
Row = TypeVar("Row")


@dataclass(frozen=True)
class CohortDefault:
    """A cohort's default canary state, from the pack's rollout.yaml."""

    cohort: str
    enabled: bool
    percentage: int = 100


@dataclass(frozen=True)
class RolloutState:
    """What the store holds, as one value: cohort → (enabled, percentage, version), kill switch."""

    cohorts: dict[str, tuple[bool, int, int]]
    kill_switch: bool
    kill_switch_version: int

    @property
    def etag(self) -> str:
        """A strong validator of the whole state: its content and its versions. Versions alone
        repeat across databases (every fresh store is at version 1, whatever its rollout.yaml
        defaults) and after a restore from a backup, and an engine holding such an ETag would be
        told 304 and keep deciding with another state."""
        parts = [f"{c}:{int(e)}:{p}:{v}" for c, (e, p, v) in sorted(self.cohorts.items())]
        parts.append(f"kill:{int(self.kill_switch)}:{self.kill_switch_version}")
        return '"' + hashlib.sha256(",".join(parts).encode()).hexdigest()[:32] + '"'


def ensure_defaults(*, session: Session, defaults: Iterable[CohortDefault]) -> list[str]:
    """Insert the pack's default state for cohorts that have no row yet (first start, or a stage
    added to the pack later); existing rows keep their state. Returns the cohorts added."""
    existing = set(session.scalars(select(Canary.cohort)))
    added = []
    for d in defaults:
        if d.cohort in existing:
            continue
        session.add(
            Canary(
                cohort=d.cohort,
                enabled=d.enabled,
                percentage=d.percentage,
                version=1,
                updated_at=utcnow(),
                updated_by="pack defaults",
            )
        )
        added.append(d.cohort)
    if session.get(KillSwitch, KILL_SWITCH_ID) is None:
        session.add(
            KillSwitch(
                id=KILL_SWITCH_ID,
                engaged=False,
                version=1,
                updated_at=utcnow(),
                updated_by="pack defaults",
            )
        )
    session.flush()
    return added


def list_canaries(*, session: Session) -> list[Canary]:
    return list(session.scalars(select(Canary).order_by(Canary.cohort)))


def get_canary(*, session: Session, cohort: str, for_update: bool = False) -> Canary:
    """One cohort's row; ``for_update`` locks it until the transaction ends (read the version
    a flip in the same transaction will name). Raises NotFound for an unknown cohort."""
    canary = (
        locked(session, select(Canary).where(Canary.cohort == cohort))
        if for_update
        else session.get(Canary, cohort)
    )
    if canary is None:
        raise NotFound(f"unknown cohort {cohort!r}", code=ErrorCode.UNKNOWN_COHORT)
    return canary


def locked(session: Session, stmt: Select[Row]) -> Row | None:
    """The row of ``stmt``, locked (``FOR UPDATE``) and read from the database even when the
    session holds it already: PostgreSQL reads committed rows, and a copy loaded earlier in the
    transaction may predate a change another writer committed since."""
    return session.scalars(
        stmt.with_for_update().execution_options(populate_existing=True)
    ).one_or_none()


def get_kill_switch(*, session: Session) -> KillSwitch:
    ks = session.get(KillSwitch, KILL_SWITCH_ID)
    if ks is None:
        raise NotFound("the kill switch row is missing: run `turnout db upgrade` and start once")
    return ks


def read_state(*, session: Session) -> RolloutState:
    rows = session.execute(
        select(Canary.cohort, Canary.enabled, Canary.percentage, Canary.version)
    ).all()
    ks = session.get(KillSwitch, KILL_SWITCH_ID)
    return RolloutState(
        cohorts={r.cohort: (bool(r.enabled), int(r.percentage), int(r.version)) for r in rows},
        kill_switch=bool(ks.engaged) if ks else False,
        kill_switch_version=int(ks.version) if ks else 0,
    )


def canary_json(canary: Canary) -> dict[str, Any]:
    return {"enabled": canary.enabled, "percentage": canary.percentage, "version": canary.version}


@dataclass(frozen=True)
class Flip:
    """What :func:`flip_canary` did: the cohort's row after it, and whether its state changed
    (false when the flip asked for the state the cohort already had)."""

    canary: Canary
    changed: bool


def flip_canary(
    *,
    session: Session,
    cohort: str,
    enabled: bool,
    reason: str,
    actor: str,
    if_version: int,
    percentage: int | None = None,
    kind: webhooks.Kind = webhooks.Kind.flip,
) -> Flip:
    """Set a cohort's canary; the caller commits. ``percentage`` None keeps the current one.
    Setting the state the cohort already has (same ``enabled``, same percentage) changes
    nothing: no version bump, no audit entry, ``changed`` false. The version is checked first
    either way, so a stale reader still learns that the cohort moved. A change is notified
    as ``kind`` (webhooks) and ends the cohort's live ramp, if any.

    Raises:
        NotFound: unknown cohort (``code=ErrorCode.UNKNOWN_COHORT``).
        VersionConflict: ``if_version`` is not the current version.
        InvalidChange: empty reason, or percentage outside 0..100.
    """
    audit.require_reason(reason)
    if percentage is not None and not 0 <= percentage <= 100:
        raise InvalidChange(
            f"percentage {percentage} is outside 0..100", code=ErrorCode.BAD_PERCENTAGE
        )
    canary = locked(session, select(Canary).where(Canary.cohort == cohort))
    if canary is None:
        raise NotFound(f"unknown cohort {cohort!r}", code=ErrorCode.UNKNOWN_COHORT)
    if canary.version != if_version:
        raise VersionConflict(
            f"cohort {cohort!r} is at version {canary.version}, not {if_version}: "
            "re-read it and decide again",
            current_version=canary.version,
        )
    if canary.enabled == enabled and percentage in (None, canary.percentage):
        return Flip(canary, changed=False)
    now = utcnow()
    before = set_state(canary, enabled=enabled, percentage=percentage, actor=actor, at=now)
    entry = audit.record(
        session=session,
        actor=actor,
        action="canary.flip",
        target=f"cohort:{cohort}",
        reason=reason,
        before=before,
        after=canary_json(canary),
        at=now,
    )
    webhooks.enqueue(session=session, kind=kind, entry=entry, extra={"cohort": cohort})
    # A flip by hand takes the cohort from its ramp (function-level: ramps imports this module).
    from turnout.dashboard.store import ramps

    ramps.supersede(
        session=session,
        cohort=cohort,
        actor=actor,
        now=now,
        why=f"superseded by a flip ({reason.strip()})",
    )
    return Flip(canary, changed=True)


def set_state(
    canary: Canary, *, enabled: bool, percentage: int | None, actor: str, at: dt.datetime
) -> dict[str, Any]:
    """Change a locked cohort row (``percentage`` None keeps it) and bump its version; the
    caller audits. Returns the row's state before, as :func:`canary_json`."""
    before = canary_json(canary)
    canary.enabled = enabled
    if percentage is not None:
        canary.percentage = percentage
    canary.version += 1
    canary.updated_at = at
    canary.updated_by = actor
    return before


@dataclass(frozen=True)
class KillSwitchSet:
    """What :func:`set_kill_switch` did: the row after it, and whether it changed (false when
    it was already in the state asked for, e.g. a second operator engaging it in an incident)."""

    kill_switch: KillSwitch
    changed: bool


def set_kill_switch(
    *, session: Session, engaged: bool, reason: str, actor: str, if_version: int | None = None
) -> KillSwitchSet:
    """Engage or release the kill switch; ``if_version`` None means "whatever it is now" (an
    emergency stop must not need a read first). Setting the state it already has changes
    nothing: no version bump, no audit entry, ``changed`` false.

    Raises:
        VersionConflict: ``if_version`` given and not the current version.
        InvalidChange: empty reason.
        NotFound: the kill switch row is missing (the service never started on this database).
    """
    audit.require_reason(reason)
    ks = locked(session, select(KillSwitch).where(KillSwitch.id == KILL_SWITCH_ID))
    if ks is None:
        raise NotFound("the kill switch row is missing: start the service once")
    if if_version is not None and ks.version != if_version:
        raise VersionConflict(
            f"the kill switch is at version {ks.version}, not {if_version}",
            current_version=ks.version,
        )
    if ks.engaged == engaged:
        return KillSwitchSet(ks, changed=False)
    before = {"engaged": ks.engaged, "version": ks.version}
    ks.engaged = engaged
    ks.version += 1
    ks.updated_at = utcnow()
    ks.updated_by = actor
    entry = audit.record(
        session=session,
        actor=actor,
        action="kill_switch.set",
        target="kill-switch",
        reason=reason,
        before=before,
        after={"engaged": engaged, "version": ks.version},
        at=ks.updated_at,
    )
    webhooks.enqueue(session=session, kind=webhooks.Kind.kill_switch, entry=entry)
    return KillSwitchSet(ks, changed=True)
