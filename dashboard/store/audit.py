"""The append-only audit log: who changed what, when, why, before → after.

There is deliberately no update or delete function; the migrations also make the database refuse
both (triggers), so a bug elsewhere cannot rewrite history.
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard.store.errors import InvalidChange
from turnout.dashboard.store.models import AuditEntry, utcnow
from turnout.oracle.errors import ErrorCode

#: The longest reason a change may carry, in characters (the API, the pages and the CLI alike).
MAX_REASON_CHARS = 2_000


def record(
    *,
    session: Session,
    actor: str,
    action: str,
    target: str,
    reason: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    at: dt.datetime | None = None,
) -> AuditEntry:
    """Append one entry in the caller's transaction, dated ``at`` (default now: the service's
    background work passes the time it works at).

    Raises:
        InvalidChange: ``reason`` is empty (every change must say why).
    """
    require_reason(reason)
    entry = AuditEntry(
        at=at or utcnow(),
        actor=actor,
        action=action,
        target=target,
        reason=reason.strip(),
        before=before,
        after=after,
    )
    session.add(entry)
    session.flush()
    return entry


def require_reason(reason: str) -> None:
    """Check a change's reason: it must show something to a reader of the audit log.

    Raises:
        InvalidChange: ``code=ErrorCode.REASON_REQUIRED`` for an empty reason or one made only of
            blanks and invisible characters (zero-width spaces, other Unicode format or control
            characters); ``code=ErrorCode.REASON_TOO_LONG`` beyond :data:`MAX_REASON_CHARS`.
    """
    if not any(not ch.isspace() and unicodedata.category(ch)[0] not in "CZ" for ch in reason):
        raise InvalidChange(
            "a reason is required for every change (it has no visible text)",
            code=ErrorCode.REASON_REQUIRED,
        )
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidChange(
            f"the reason is {len(reason):,} characters; at most {MAX_REASON_CHARS:,} are kept",
            code=ErrorCode.REASON_TOO_LONG,
        )


def clip_reason(text: str, where: str = "") -> str:
    """A reason the service writes itself (a gate's figures, a flip's reason quoted by the
    ramp it ended) cut to :data:`MAX_REASON_CHARS`, saying how much was left out and, with
    ``where``, where the rest is."""
    if len(text) <= MAX_REASON_CHARS:
        return text
    tail = "… ({:,} more characters" + (f": {where})" if where else ")")
    keep = MAX_REASON_CHARS - len(tail.format(len(text)))  # the count has at most as many digits
    return text[:keep] + tail.format(len(text) - keep)


def list_entries(
    *,
    session: Session,
    limit: int = 100,
    before_id: int | None = None,
    target: str | None = None,
) -> list[AuditEntry]:
    """Newest first; page with ``before_id`` (the smallest id of the previous page)."""
    stmt = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if before_id is not None:
        stmt = stmt.where(AuditEntry.id < before_id)
    if target is not None:
        stmt = stmt.where(AuditEntry.target == target)
    return list(session.scalars(stmt))
