"""API tokens: random, shown once, stored as SHA-256 with a role (viewer < operator < admin)
and, optionally, an expiry (``--expires-in 30d``)."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
import unicodedata
from enum import StrEnum

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from turnout.dashboard.store import audit
from turnout.dashboard.store.errors import InvalidChange, NotFound
from turnout.dashboard.store.models import ApiToken, utcnow
from turnout.oracle.errors import ErrorCode

TOKEN_PREFIX = "tok_"


class Role(StrEnum):
    """What a token may do, each role everything the ones before it may: ``viewer`` reads;
    ``engine`` also reports (decision events, health reports, its registration and
    heartbeat) and is what an engine fleet holds: it changes no canary, ramp or kill switch
    itself, though its health reports and registrations feed the ramps' gates (a forged
    report can fail a gate), so it is guarded as the fleet's telemetry is;
    ``operator`` also changes the rollout; ``admin`` also manages tokens and webhooks."""

    viewer = "viewer"
    engine = "engine"
    operator = "operator"
    admin = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def allows(self, needed: Role) -> bool:
        """True when this role may do what ``needed`` may (roles are ordered)."""
        return self.rank >= needed.rank


_RANK = {Role.viewer: 0, Role.engine: 1, Role.operator: 2, Role.admin: 3}


def hash_token(token: str) -> str:
    """SHA-256 hex of the token (tokens are 256-bit random, so no salt or slow hash is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


_DURATION = re.compile(r"^\s*(\d{1,6})\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_LIFETIME = dt.timedelta(days=3660)
DURATION_HELP = "a number and a unit: s, m, h, d or w (30d, 12h, 90m), at most 3660d"


def read_duration(text: str, help_text: str = DURATION_HELP.rsplit(",", 1)[0]) -> dt.timedelta:
    """``"30d"`` → 30 days, ``"0s"`` → 0 (a number and a unit; what a span may be is its
    user's to check). Raises InvalidChange (``invalid_change``) for anything else."""
    found = _DURATION.match(text)
    if found is None:
        raise InvalidChange(f"{text!r} is not a duration: {help_text}")
    return dt.timedelta(seconds=int(found.group(1)) * _UNIT_S[found.group(2)])


def parse_duration(text: str) -> dt.timedelta:
    """A token's lifetime: ``"30d"`` → 30 days. Raises InvalidChange (``invalid_change``) for
    anything else, zero or more than ``MAX_LIFETIME``."""
    span = read_duration(text, DURATION_HELP)
    if not dt.timedelta(0) < span <= MAX_LIFETIME:
        raise InvalidChange(f"{text!r}: a token lives more than 0 s and at most 3660 days")
    return span


def create_token(
    *, session: Session, name: str, role: Role, actor: str, expires_in: dt.timedelta | None = None
) -> tuple[ApiToken, str]:
    """Make a token (expiring ``expires_in`` from now; None: never); returns the row and the
    token itself (the only time it exists in clear).

    Raises:
        InvalidChange: ``NAME_REQUIRED`` when the name has no visible character (blank, or
            only zero-width and format characters such as U+200B), ``INVALID_REQUEST`` when it
            holds a control character (a terminal escape would reach every audit listing).
    """
    if not any(c.isprintable() and not c.isspace() for c in name):
        raise InvalidChange(
            "a token needs a name (who or what uses it) with a visible character",
            code=ErrorCode.NAME_REQUIRED,
        )
    if any(unicodedata.category(c) == "Cc" for c in name.strip()):
        raise InvalidChange(
            f"a token's name may not hold a control character: {name!r}",
            code=ErrorCode.INVALID_REQUEST,
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    row = ApiToken(
        name=name.strip(),
        role=role.value,
        token_hash=hash_token(token),
        prefix=token[: len(TOKEN_PREFIX) + 6],
        created_at=now,
        created_by=actor,
        expires_at=now + expires_in if expires_in is not None else None,
    )
    session.add(row)
    session.flush()
    expiry = f", expires {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else ""
    audit.record(
        session=session,
        actor=actor,
        action="token.create",
        target=f"token:{row.id}",
        reason=f"token {row.name!r} for role {role.value}{expiry}",
        before=None,
        after={
            "id": row.id,
            "name": row.name,
            "role": row.role,
            "prefix": row.prefix,
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
        },
    )
    return row, token


def find_token(*, session: Session, token: str) -> ApiToken | None:
    """The row of ``token`` whatever its state (revoked, expired), or None."""
    return session.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()


def is_expired(row: ApiToken, now: dt.datetime | None = None) -> bool:
    return row.expires_at is not None and (now or utcnow()) >= row.expires_at


def verify_token(*, session: Session, token: str) -> ApiToken | None:
    """The live token row for ``token``, or None (unknown, revoked or expired)."""
    row = find_token(session=session, token=token)
    if row is None or row.revoked_at is not None or is_expired(row):
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
        audit.record(
            session=session,
            actor=actor,
            action="token.revoke",
            target=f"token:{row.id}",
            reason=reason,
            before={"revoked": False},
            after={"revoked": True},
        )
    return row


def count_tokens(*, session: Session) -> int:
    """Live tokens: neither revoked nor expired."""
    live = (
        select(ApiToken.id)
        .where(ApiToken.revoked_at.is_(None))
        .where(or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > utcnow()))
    )
    return len(list(session.scalars(live)))
