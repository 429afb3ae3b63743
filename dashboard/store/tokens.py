"""API tokens: random, shown once, stored as SHA-256 with a role (viewer < operator < admin)."""

from __future__ import annotations

import hashlib
import secrets
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.store import audit
from dashboard.store.errors import InvalidChange, NotFound
from dashboard.store.models import ApiToken, utcnow
from oracle.errors import ErrorCode

TOKEN_PREFIX = "tok_"


class Role(StrEnum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def allows(self, needed: Role) -> bool:
        """True when this role may do what ``needed`` may (roles are ordered)."""
        return self.rank >= needed.rank


_RANK = {Role.viewer: 0, Role.operator: 1, Role.admin: 2}


def hash_token(token: str) -> str:
    """SHA-256 hex of the token (tokens are 256-bit random, so no salt or slow hash is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(*, session: Session, name: str, role: Role, actor: str) -> tuple[ApiToken, str]:
    """Make a token; returns the row and the token itself (the only time it exists in clear)."""
    if not name.strip():
        raise InvalidChange("a token needs a name (who or what uses it)",
                            code=ErrorCode.NAME_REQUIRED)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name.strip(), role=role.value, token_hash=hash_token(token),
                   prefix=token[: len(TOKEN_PREFIX) + 6], created_at=utcnow(), created_by=actor)
    session.add(row)
    session.flush()
    audit.record(session=session, actor=actor, action="token.create", target=f"token:{row.id}",
                 reason=f"token {row.name!r} for role {role.value}", before=None,
                 after={"id": row.id, "name": row.name, "role": row.role, "prefix": row.prefix})
    return row, token


def verify_token(*, session: Session, token: str) -> ApiToken | None:
    """The live token row for ``token``, or None (unknown or revoked)."""
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is None or row.revoked_at is not None:
        return None
    return row


def list_tokens(*, session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(*, session: Session, token_id: int, actor: str, reason: str) -> ApiToken:
    """Raises NotFound for an unknown id; revoking twice is a no-op."""
    audit.require_reason(reason)
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"no token with id {token_id}", code=ErrorCode.UNKNOWN_TOKEN)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        audit.record(session=session, actor=actor, action="token.revoke",
                     target=f"token:{row.id}", reason=reason,
                     before={"revoked": False}, after={"revoked": True})
    return row


def count_tokens(*, session: Session) -> int:
    return len(list(session.scalars(select(ApiToken.id).where(ApiToken.revoked_at.is_(None)))))
