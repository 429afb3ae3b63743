"""The append-only audit log: who changed what, when, why, before → after.

There is deliberately no update or delete function; the migrations also make the database refuse
both (triggers), so a bug elsewhere cannot rewrite history.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.store.errors import InvalidChange
from dashboard.store.models import AuditEntry, utcnow


def record(
    *,
    session: Session,
    actor: str,
    action: str,
    target: str,
    reason: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditEntry:
    """Append one entry in the caller's transaction.

    Raises:
        InvalidChange: ``reason`` is empty (every change must say why).
    """
    require_reason(reason)
    entry = AuditEntry(
        at=utcnow(), actor=actor, action=action, target=target, reason=reason.strip(),
        before=before, after=after,
    )
    session.add(entry)
    session.flush()
    return entry


def require_reason(reason: str) -> None:
    """Raises InvalidChange (``code="reason_required"``) for an empty or blank reason."""
    if not reason.strip():
        raise InvalidChange("a reason is required for every change", code="reason_required")


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
