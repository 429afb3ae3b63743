"""Alertmanager's alerts, received once per firing, and the actions they take on the rollout.

:func:`receive` takes the alerts of one webhook notification for one receiver of
``TURNOUT_ALERTMANAGER_CONFIG`` (``dashboard/alertmanager.py`` matched each to its action) in
the caller's transaction, in two phases:

1. **Claim.** Each alert's receipt is inserted with ``ON CONFLICT DO NOTHING`` on its key
   (receiver, fingerprint, startsAt), in key order. An alert whose receipt exists is a repeat
   of a firing already received (Alertmanager resends firing alerts every
   ``repeat_interval``; an HA pair sends each notification twice): it acts no more. A
   concurrent delivery of the same alert waits on the key until the first commits, then
   finds it: the database's uniqueness, not a read, decides which acts.
2. **Act.** The new firing alerts, grouped by (action, stage) and taken in stage order (the
   kill switch last, so that two deliveries lock rows in one order), act once per group:
   the group's first alert acts, the others are recorded as ``no_change``. An action finds
   its rows under the locks every ramp change takes (the stage's canary row, then its ramp),
   so a second delivery acting on the same stage waits, then sees the first's change.

The actions: ``pause`` pauses the stage's active ramp (audited ``ramp.pause``); ``rollback``
ends the stage's live ramp as rolled back and disables its canary (``ramp.rollback``; a stage
with no live ramp but enabled is disabled, ``canary.flip``); ``kill_switch`` engages the kill
switch (``kill_switch.set``). Each is audited by ``alertmanager:<receiver>`` with the alert's
name, generatorURL and labels as its reason, and notified as an operator's action is
(``gate_failure`` for a ramp paused or rolled back, ``flip``, ``kill_switch``); acting on
what is already so (a paused ramp, an engaged kill switch) writes no audit entry. A resolved
alert only records its end (``resolved_at``): an operator resumes.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from turnout.dashboard.store import audit, canaries, ramps, webhooks
from turnout.dashboard.store.errors import NotFound
from turnout.dashboard.store.models import AuditEntry, Canary, Deployment, utcnow
from turnout.dashboard.store.models_rollout import AlertReceipt, Ramp
from turnout.dashboard.store.ramps import RampState

ACTOR_PREFIX = "alertmanager:"


class Action(StrEnum):
    """What a rule of a receiver does with a firing alert."""

    pause = "pause"  # pause the stage's active ramp
    rollback = "rollback"  # end the stage's live ramp, disable its canary
    kill_switch = "kill_switch"  # engage the kill switch (no stage needed)


class Outcome(StrEnum):
    """What came of one alert (a receipt's ``outcome``; the answer counts them)."""

    acted = "acted"  # this alert made the change (an audit entry)
    no_change = "no_change"  # what it asks for was so already (an earlier alert, an operator)
    no_ramp = "no_ramp"  # pause: the stage has no active ramp
    no_stage = "no_stage"  # pause / rollback: no stage from its labels
    unknown_stage = "unknown_stage"  # its stage label names no stage of the store
    no_rule = "no_rule"  # no rule of the receiver matched its labels
    duplicate = "duplicate"  # a repeat of a firing already received (no receipt of its own)
    resolved = "resolved"  # a resolved alert: recorded, nothing done


@dataclass(frozen=True)
class ReceivedAlert:
    """One alert of a notification, as the receiver's rules read it.

    ``stage`` is its ``turnout_stage`` label, ``deployment`` its ``turnout_deployment``,
    ``family_stage`` the stage the pack gives its ``turnout_family`` (None: none of these);
    the stage acted on is the first of: the label, the deployment's stage as its latest
    decision recorded it, the family's stage. Times are UTC; ``ends_at`` None for an alert
    without one."""

    fingerprint: str
    status: str  # firing | resolved
    starts_at: dt.datetime
    ends_at: dt.datetime | None
    labels: dict[str, str]
    generator_url: str
    action: Action | None
    stage: str | None = None
    deployment: str | None = None
    family_stage: str | None = None

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "(no alertname)")

    def as_json(self, receiver: str) -> dict[str, Any]:
        """The alert as the notifications of its action carry it."""
        return {
            "receiver": receiver,
            "fingerprint": self.fingerprint,
            "startsAt": self.starts_at.isoformat(),
            "labels": self.labels,
            "generatorURL": self.generator_url,
        }


@dataclass(frozen=True)
class Taken:
    """An action an alert took now."""

    action: Action
    cohort: str | None
    audit_id: int
    fingerprint: str


@dataclass
class Report:
    """What :func:`receive` did: alerts per outcome, the actions taken, and whether the
    canaries or the kill switch changed (the caller drops its cached snapshot)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    actions: list[Taken] = field(default_factory=list)
    rollout_changed: bool = False


def actor_of(receiver: str) -> str:
    return ACTOR_PREFIX + receiver


def reason_of(receiver: str, alert: ReceivedAlert) -> str:
    """The audit reason of an alert's action: its name, receiver, fingerprint, start, its
    generatorURL, then its labels (cut, saying so, where a reason ends: the receipt keeps the
    labels in full)."""
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(alert.labels.items()))
    text = (
        f"Alertmanager alert {alert.alertname} (receiver {receiver}, fingerprint "
        f"{alert.fingerprint}, firing since {alert.starts_at:%Y-%m-%dT%H:%M:%SZ}): "
        f"{alert.generator_url or 'no generatorURL'}; labels {{{labels}}}"
    )
    return audit.clip_reason(text, "every label in the alert's receipt")


#: How long the receipt of a resolved alert is kept. A firing one is kept until it resolves:
#: its key is what tells Alertmanager's resends (every repeat_interval) from a new firing.
KEEP_RESOLVED = dt.timedelta(days=30)


def receive(
    *,
    session: Session,
    receiver: str,
    alerts: Sequence[ReceivedAlert],
    now: dt.datetime | None = None,
) -> Report:
    """Record the alerts of one notification for ``receiver`` and act on the new firing ones
    (see the module doc); the caller commits. Receipts resolved more than
    :data:`KEEP_RESOLVED` before ``now`` are deleted. Raises nothing of its own: a stage that is
    missing or unknown, a ramp that is not there, are outcomes of the alert."""
    now = now or utcnow()
    session.execute(delete(AlertReceipt).where(AlertReceipt.resolved_at < now - KEEP_RESOLVED))
    report = Report()
    fresh: list[tuple[int, ReceivedAlert]] = []
    for alert in sorted(alerts, key=lambda a: (a.fingerprint, a.starts_at, a.status)):
        receipt_id = _claim(session, receiver, alert, now)
        if alert.status == "resolved":
            if receipt_id is None:
                _mark_resolved(session, receiver, alert, now)
            report.outcomes[Outcome.resolved] += 1
        elif receipt_id is None:
            report.outcomes[Outcome.duplicate] += 1
        else:
            fresh.append((receipt_id, alert))
    groups: dict[tuple[str, Action], list[tuple[int, ReceivedAlert]]] = {}
    for receipt_id, alert in fresh:
        cohort, settled = _target(session, alert)
        if settled is not None:
            _settle(session, [receipt_id], settled, cohort, None)
            report.outcomes[settled] += 1
            continue
        assert alert.action is not None
        key = "" if alert.action == Action.kill_switch else (cohort or "")
        groups.setdefault((key, alert.action), []).append((receipt_id, alert))
    for (cohort, action), members in sorted(groups.items(), key=_lock_order):
        first_id, first = members[0]
        outcome, entry_id = _act(session, receiver, action, cohort or None, first, now)
        _settle(session, [first_id], outcome, cohort or None, entry_id)
        rest = Outcome.no_change if outcome in (Outcome.acted, Outcome.no_change) else outcome
        _settle(session, [r for r, _ in members[1:]], rest, cohort or None, None)
        report.outcomes[outcome] += 1
        if len(members) > 1:
            report.outcomes[rest] += len(members) - 1
        if entry_id is not None:
            report.actions.append(Taken(action, cohort or None, entry_id, first.fingerprint))
            report.rollout_changed = True
    return report


_ACTION_ORDER = {Action.rollback: 0, Action.pause: 1, Action.kill_switch: 2}


def _lock_order(item: tuple[tuple[str, Action], object]) -> tuple[int, str, int]:
    """Stages by name (a rollback before a pause of the same stage: the pause finds nothing
    left to pause), the kill switch last."""
    (cohort, action), _ = item
    return (int(action == Action.kill_switch), cohort, _ACTION_ORDER[action])


def _claim(session: Session, receiver: str, alert: ReceivedAlert, now: dt.datetime) -> int | None:
    """Insert the alert's receipt unless its key is there; its id, or None when it was."""
    values: dict[str, Any] = {
        "receiver": receiver,
        "fingerprint": alert.fingerprint,
        "starts_at": alert.starts_at,
        "status": alert.status,
        "labels": alert.labels,
        "generator_url": alert.generator_url,
        "action": alert.action.value if alert.action else None,
        "cohort": None,
        "outcome": Outcome.resolved.value if alert.status == "resolved" else "pending",
        "audit_id": None,
        "received_at": now,
        # The service's own time: Alertmanager's endsAt may be anything (days back, before
        # startsAt), and the receipt's pruning counts from this.
        "resolved_at": now if alert.status == "resolved" else None,
    }
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = (
        insert(AlertReceipt)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["receiver", "fingerprint", "starts_at"])
        .returning(AlertReceipt.id)
    )
    return session.execute(stmt).scalar_one_or_none()


def _mark_resolved(session: Session, receiver: str, alert: ReceivedAlert, now: dt.datetime) -> None:
    session.execute(
        update(AlertReceipt)
        .where(
            AlertReceipt.receiver == receiver,
            AlertReceipt.fingerprint == alert.fingerprint,
            AlertReceipt.starts_at == alert.starts_at,
            AlertReceipt.resolved_at.is_(None),
        )
        .values(resolved_at=now)
    )


def _target(session: Session, alert: ReceivedAlert) -> tuple[str | None, Outcome | None]:
    """The stage a new firing alert acts on, and its outcome when it cannot act at all."""
    cohort = alert.stage
    if cohort is None and alert.deployment is not None:
        cohort = session.scalar(
            select(Deployment.stage).where(Deployment.deployment_id == alert.deployment)
        )
    cohort = cohort or alert.family_stage
    if alert.action is None:
        return cohort, Outcome.no_rule
    if alert.action == Action.kill_switch:
        return cohort, None
    if cohort is None:
        return None, Outcome.no_stage
    if session.get(Canary, cohort) is None:
        return cohort, Outcome.unknown_stage
    return cohort, None


def _settle(
    session: Session, ids: list[int], outcome: str, cohort: str | None, audit_id: int | None
) -> None:
    for start in range(0, len(ids), 500):
        session.execute(
            update(AlertReceipt)
            .where(AlertReceipt.id.in_(ids[start : start + 500]))
            .values(outcome=outcome, cohort=cohort, audit_id=audit_id)
        )


def _act(
    session: Session,
    receiver: str,
    action: Action,
    cohort: str | None,
    alert: ReceivedAlert,
    now: dt.datetime,
) -> tuple[Outcome, int | None]:
    """Take ``action`` for ``alert``: its outcome and the id of its audit entry (None when it
    changed nothing)."""
    actor, reason = actor_of(receiver), reason_of(receiver, alert)
    extra = {"alert": alert.as_json(receiver)}
    if action == Action.kill_switch:
        done = canaries.set_kill_switch(session=session, engaged=True, reason=reason, actor=actor)
        if not done.changed:
            return Outcome.no_change, None
        return Outcome.acted, _latest_audit_id(session, "kill-switch")
    assert cohort is not None
    try:
        canary = canaries.get_canary(session=session, cohort=cohort, for_update=True)
    except NotFound:  # removed since _target looked
        return Outcome.unknown_stage, None
    found = ramps.live_ramp(session=session, cohort=cohort)
    ramp = ramps.lock(session, found.id)[1] if found is not None else None
    if action == Action.pause:
        if ramp is None or ramp.state == RampState.pending_approval:
            return Outcome.no_ramp, None
        if ramp.state == RampState.paused:
            return Outcome.no_change, None
        return Outcome.acted, _ramp_change(
            session, canary, ramp, "ramp.pause", actor, reason, now, extra
        )
    if ramp is None:
        if not canary.enabled:
            return Outcome.no_change, None
        before = canaries.set_state(canary, enabled=False, percentage=None, actor=actor, at=now)
        entry = audit.record(
            session=session,
            actor=actor,
            action="canary.flip",
            target=f"cohort:{cohort}",
            reason=reason,
            before=before,
            after=canaries.canary_json(canary),
            at=now,
        )
        webhooks.enqueue(
            session=session,
            kind=webhooks.Kind.flip,
            entry=entry,
            extra={"cohort": cohort, **extra},
        )
        return Outcome.acted, entry.id
    return Outcome.acted, _ramp_change(
        session, canary, ramp, "ramp.rollback", actor, reason, now, extra
    )


def _ramp_change(
    session: Session,
    canary: Canary,
    ramp: Ramp,
    action: str,
    actor: str,
    reason: str,
    now: dt.datetime,
    extra: dict[str, Any],
) -> int:
    """Pause a live ramp, or roll it back (``action``), both rows locked; audited and
    notified as a gate failure is. Returns the audit entry's id."""
    before = ramps.ramp_json(ramp)
    ramp.version += 1
    ramp.updated_at = now
    if action == "ramp.rollback":
        ramp.state, ramp.ended_at, ramp.end_reason = RampState.rolled_back.value, now, reason
        if canary.enabled:  # a ramp waiting for approval has not enabled it
            canaries.set_state(canary, enabled=False, percentage=None, actor=actor, at=now)
    else:
        ramp.state = RampState.paused.value
    entry = audit.record(
        session=session,
        actor=actor,
        action=action,
        target=f"cohort:{ramp.cohort}",
        reason=reason,
        before=before,
        after=ramps.ramp_json(ramp),
        at=now,
    )
    webhooks.enqueue(
        session=session,
        kind=webhooks.Kind.gate_failure,
        entry=entry,
        extra={
            "cohort": ramp.cohort,
            "ramp_id": ramp.id,
            "canary": canaries.canary_json(canary),
            "on_failure": "rollback" if action == "ramp.rollback" else "pause",
            **extra,
        },
    )
    return entry.id


def _latest_audit_id(session: Session, target: str) -> int:
    """The newest audit entry of ``target`` (this transaction's, its row being locked)."""
    found = session.scalar(
        select(AuditEntry.id)
        .where(AuditEntry.target == target)
        .order_by(AuditEntry.id.desc())
        .limit(1)
    )
    assert found is not None
    return found


def list_receipts(
    *, session: Session, receiver: str | None = None, limit: int = 100
) -> list[AlertReceipt]:
    """Receipts, newest first."""
    stmt = select(AlertReceipt).order_by(AlertReceipt.id.desc()).limit(limit)
    if receiver is not None:
        stmt = stmt.where(AlertReceipt.receiver == receiver)
    return list(session.scalars(stmt))
