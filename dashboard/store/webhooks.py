"""Webhook subscriptions and the outbox they are fed from.

:func:`enqueue` writes one outbox entry per subscription of an event's kind, in the caller's
transaction: the event (a flip, a ramp step, ...) and its deliveries commit together or not
at all, so a crash between the two loses none. ``dashboard.store.delivery`` sends them.
Every notification is made from the audit entry of its event, which it carries.
"""

from __future__ import annotations

import datetime as dt
import secrets
import unicodedata
import uuid
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from turnout.dashboard.egress import EgressPolicy, EgressRefused
from turnout.dashboard.store import audit
from turnout.dashboard.store.errors import Conflict, InvalidChange, NotFound
from turnout.dashboard.store.models import AuditEntry, utcnow
from turnout.dashboard.store.models_rollout import OutboxEntry, Webhook
from turnout.oracle.errors import ErrorCode

SECRET_PREFIX = "whsec_"
MAX_URL_CHARS = 2048
MIN_SECRET_CHARS, MAX_SECRET_CHARS = 16, 256
MAX_DESCRIPTION_CHARS = 256


class Kind(StrEnum):
    """The kinds of events a subscription can ask for."""

    flip = "flip"  # an operator's flip of a cohort (API, page, command line, approved flip)
    ramp_step = "ramp_step"  # a ramp started, stepped, completed, resumed or was cancelled
    gate_failure = "gate_failure"  # a gate failed: the ramp paused or rolled its stage back
    kill_switch = "kill_switch"  # engaged or released
    scheduled_flip = "scheduled_flip"  # a flip was scheduled, ran, failed or was cancelled
    approval = "approval"  # a change awaits a second operator, was approved or rejected
    # the canary state changed and live engines run another runner than it gives them
    restart_required = "restart_required"


class OutboxState(StrEnum):
    pending = "pending"
    delivered = "delivered"
    dead = "dead"


def parse_kinds(kinds: list[str]) -> list[str]:
    """``kinds`` checked and in the order of :class:`Kind` (each once).

    Raises:
        InvalidChange: none given, or a name that is not a kind (``code=invalid_change``).
    """
    names = [k.value for k in Kind]
    unknown = sorted(set(kinds) - set(names))
    if unknown:
        raise InvalidChange(
            f"unknown event kind(s) {', '.join(map(repr, unknown))}: use {', '.join(names)}"
        )
    if not kinds:
        raise InvalidChange(f"a subscription needs at least one kind ({', '.join(names)})")
    return [n for n in names if n in kinds]


def check_url(url: str, egress: EgressPolicy) -> str:
    """An ``http://`` or ``https://`` URL with a host (and a port in 0..65535, if any), with
    no space or control character in it, whose host is no address literal ``egress`` refuses
    (loopback, private, metadata...: ``dashboard.egress``). Raises InvalidChange otherwise,
    saying why."""
    url = url.strip()
    shown = repr(url[:200])
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in url):
        raise InvalidChange(
            f"the webhook URL {shown} holds a space or control character (percent-encode it)"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed on access: out of range or not a number raises
    except ValueError as err:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise InvalidChange(f"the webhook URL {shown} does not parse: {err}") from err
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL_CHARS:
        raise InvalidChange(
            f"the webhook URL {shown} is not an http:// or https:// URL "
            f"with a host (at most {MAX_URL_CHARS} characters)"
        )
    try:
        egress.check_host(parts.hostname)
    except EgressRefused as err:
        raise InvalidChange(str(err)) from None
    return url


def add_webhook(
    *,
    session: Session,
    url: str,
    kinds: list[str],
    actor: str,
    egress: EgressPolicy,
    secret: str | None = None,
    description: str = "",
) -> tuple[Webhook, str]:
    """Subscribe ``url`` to ``kinds``; returns the row and its secret (made here when None:
    ``whsec_`` and 32 random bytes, URL-safe base64). Audited as ``webhook.add``.

    Raises:
        InvalidChange: a URL that is not http(s) or whose host ``egress`` refuses, no or
            unknown kinds, a secret of fewer
            than 16 or more than 256 characters, a description over 256.
    """
    url, kinds = check_url(url, egress), parse_kinds(kinds)
    secret = secret if secret is not None else SECRET_PREFIX + secrets.token_urlsafe(32)
    if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
        raise InvalidChange(
            f"a webhook secret has {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} "
            f"characters, not {len(secret)}"
        )
    if len(description.strip()) > MAX_DESCRIPTION_CHARS:
        raise InvalidChange(
            f"a webhook description has at most {MAX_DESCRIPTION_CHARS} "
            f"characters, not {len(description.strip())}"
        )
    row = Webhook(
        url=url,
        secret=secret,
        kinds=kinds,
        description=description.strip(),
        created_at=utcnow(),
        created_by=actor,
    )
    session.add(row)
    session.flush()
    audit.record(
        session=session,
        actor=actor,
        action="webhook.add",
        target=f"webhook:{row.id}",
        reason=audit.clip_reason(f"deliver {', '.join(kinds)} to {url}"),
        before=None,
        after={"url": url, "kinds": kinds, "description": row.description},
    )
    return row, secret


def list_webhooks(*, session: Session, include_removed: bool = False) -> list[Webhook]:
    stmt = select(Webhook).order_by(Webhook.id)
    if not include_removed:
        stmt = stmt.where(Webhook.removed_at.is_(None))
    return list(session.scalars(stmt))


def remove_webhook(*, session: Session, webhook_id: int, actor: str, reason: str) -> Webhook:
    """End a subscription; its pending deliveries become dead (``the subscription was
    removed``). Removing a removed one changes nothing.

    Raises:
        NotFound: no such subscription. InvalidChange: empty reason.
    """
    audit.require_reason(reason)
    row = session.get(Webhook, webhook_id, with_for_update=True)
    if row is None:
        raise NotFound(f"no webhook {webhook_id}", code=ErrorCode.UNKNOWN_WEBHOOK)
    if row.removed_at is not None:
        return row
    row.removed_at = utcnow()
    session.execute(
        update(OutboxEntry)
        .where(OutboxEntry.webhook_id == webhook_id, OutboxEntry.state == OutboxState.pending)
        .values(state=OutboxState.dead, last_error="the subscription was removed")
    )
    audit.record(
        session=session,
        actor=actor,
        action="webhook.remove",
        target=f"webhook:{row.id}",
        reason=reason,
        before={"url": row.url},
        after=None,
    )
    return row


def payload_of(kind: Kind, entry: AuditEntry, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON body of a notification: its kind, the audit entry it comes from, ``extra``."""
    return {
        "kind": kind.value,
        "action": entry.action,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "target": entry.target,
        "reason": entry.reason,
        "before": entry.before,
        "after": entry.after,
        "audit_id": entry.id,
        **(extra or {}),
    }


def enqueue(
    *, session: Session, kind: Kind, entry: AuditEntry, extra: dict[str, Any] | None = None
) -> int:
    """One pending delivery per live subscription of ``kind``, in the caller's transaction,
    due at once. Returns how many were written."""
    hooks = [w for w in list_webhooks(session=session) if kind.value in w.kinds]
    for hook in hooks:
        delivery_id = uuid.uuid4().hex
        session.add(
            OutboxEntry(
                webhook_id=hook.id,
                delivery_id=delivery_id,
                kind=kind.value,
                payload={"delivery_id": delivery_id, **payload_of(kind, entry, extra)},
                state=OutboxState.pending.value,
                num_attempts=0,
                created_at=entry.at,
                next_attempt_at=entry.at,
            )
        )
    if hooks:
        session.flush()
    return len(hooks)


def list_outbox(
    *, session: Session, state: str | None = None, limit: int = 100, webhook_id: int | None = None
) -> list[OutboxEntry]:
    """Newest first."""
    stmt = select(OutboxEntry).order_by(OutboxEntry.id.desc()).limit(limit)
    if state is not None:
        stmt = stmt.where(OutboxEntry.state == state)
    if webhook_id is not None:
        stmt = stmt.where(OutboxEntry.webhook_id == webhook_id)
    return list(session.scalars(stmt))


def outbox_counts(*, session: Session) -> dict[str, int]:
    """State → entries (every state, zero included)."""
    out = {s.value: 0 for s in OutboxState}
    for state, n in session.execute(
        select(OutboxEntry.state, func.count()).group_by(OutboxEntry.state)
    ):
        out[str(state)] = int(n)
    return out


def retry_dead(
    *, session: Session, entry_id: int, actor: str, now: dt.datetime | None = None
) -> OutboxEntry:
    """Send a dead delivery back to the queue, due now, with its attempts counted afresh.

    Raises:
        NotFound: no such entry. Conflict: it is not dead, or its subscription was removed.
    """
    row = session.get(OutboxEntry, entry_id, with_for_update=True)
    if row is None:
        raise NotFound(f"no outbox entry {entry_id}", code=ErrorCode.NOT_FOUND)
    hook = session.get(Webhook, row.webhook_id)
    if row.state != OutboxState.dead or hook is None or hook.removed_at is not None:
        raise Conflict(
            f"outbox entry {entry_id} is {row.state}"
            + ("" if row.state != OutboxState.dead else " and its subscription was removed")
            + ": nothing to retry"
        )
    now = now or utcnow()
    before = {"state": row.state, "num_attempts": row.num_attempts}
    row.state, row.num_attempts, row.next_attempt_at = OutboxState.pending.value, 0, now
    row.leased_until = None
    audit.record(
        session=session,
        actor=actor,
        action="webhook.retry",
        target=f"webhook:{row.webhook_id}",
        reason=f"retry delivery {row.delivery_id} ({row.kind})",
        before=before,
        after={"state": row.state, "num_attempts": 0},
        at=now,
    )
    return row
