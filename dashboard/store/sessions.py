"""Page sessions, kept server-side: the cookie holds a random id, the store its SHA-256.

A session belongs to the token that signed in; it ends at its expiry, at sign-out, or as soon
as its token is revoked or expires (checked on every use, not cached).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from turnout.dashboard.store.models import ApiToken, PageSession, utcnow
from turnout.dashboard.store.tokens import is_expired

SESSION_PREFIX = "ses_"


def hash_session_id(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True)
class LiveSession:
    """A session in use and the token it signed in with."""

    id_hash: str
    expires_at: dt.datetime
    token: ApiToken


def start_session(
    *, session: Session, token: ApiToken, ttl: dt.timedelta
) -> tuple[str, PageSession]:
    """A new session for ``token``, ending ``ttl`` from now (or at the token's own expiry,
    whichever is first); returns its id (the cookie's value, never stored) and its row.
    Sessions that ended or expired are deleted on the way (the table stays small)."""
    now = utcnow()
    session.execute(
        delete(PageSession).where(
            or_(PageSession.expires_at <= now, PageSession.ended_at.is_not(None))
        )
    )
    session_id = SESSION_PREFIX + secrets.token_urlsafe(32)
    ends = now + ttl
    if token.expires_at is not None:
        ends = min(ends, token.expires_at)
    row = PageSession(
        id_hash=hash_session_id(session_id), token_id=token.id, created_at=now, expires_at=ends
    )
    session.add(row)
    session.flush()
    return session_id, row


def find_session(*, session: Session, session_id: str) -> LiveSession | None:
    """The live session of ``session_id`` (None: unknown, ended, expired, or its token
    revoked or expired)."""
    found = session.execute(
        select(PageSession, ApiToken)
        .join(ApiToken, ApiToken.id == PageSession.token_id)
        .where(PageSession.id_hash == hash_session_id(session_id))
    ).first()
    if found is None:
        return None
    row, token = found
    now = utcnow()
    if row.ended_at is not None or row.expires_at <= now:
        return None
    if token.revoked_at is not None or is_expired(token, now):
        return None
    return LiveSession(row.id_hash, row.expires_at, token)


def end_session(*, session: Session, session_id: str) -> bool:
    """Sign out: the session is refused from now on; False when it was not live."""
    row = session.get(PageSession, hash_session_id(session_id))
    if row is None or row.ended_at is not None:
        return False
    row.ended_at = utcnow()
    return True
