"""Bearer-token authentication, page sessions and role checks.

Clients send ``Authorization: Bearer tok_...``. The pages sign in with a token once: the
service starts a session kept in the store and sets an HttpOnly, SameSite=Strict cookie with
the session's random id (never the token; ``Secure`` when ``TURNOUT_HTTPS``), which ends at
``session_ttl_s``, at sign-out, or when its token is revoked or expires. The sign-in form
carries a nonce that must match a cookie of its own (and its ``Origin``, when sent, the
service's host); the forms of a signed-in page carry a CSRF field derived from the session id.

Verified tokens are cached in memory for ``token_cache_ttl_s`` (a revocation takes effect
within that time) so that hot read paths such as ``POST /decide`` need no database round trip;
a token's expiry is checked on every use, cached or not. Sessions are looked up every time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from sqlalchemy.orm import Session, sessionmaker

from turnout.dashboard.store import sessions, tokens
from turnout.dashboard.store.models import ApiToken, utcnow
from turnout.dashboard.store.tokens import Role
from turnout.oracle.errors import ErrorCode

COOKIE_NAME = "turnout_session"
SIGN_IN_COOKIE = "turnout_sign_in"  # the sign-in form's nonce (double-submit)


MAX_ACTOR_CHARS = 128  # the actor, updated_by, requested_by and approved_by columns


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name, id, role, prefix and expiry."""

    name: str
    token_id: int
    role: Role
    prefix: str = ""
    expires_at: dt.datetime | None = None

    @property
    def actor(self) -> str:
        """``name (token N)``, the name cut so that the whole fits the 128 characters of the
        store's actor columns (a name may have 128 itself; the token id tells who)."""
        suffix = f" (token {self.token_id})"
        return self.name[: MAX_ACTOR_CHARS - len(suffix)] + suffix

    @classmethod
    def of(cls, row: ApiToken) -> Principal:
        return cls(row.name, row.id, Role(row.role), row.prefix, row.expires_at)


class Refusal(NamedTuple):
    """Why a credential is not accepted (the 401's code and message)."""

    code: ErrorCode
    message: str


UNKNOWN_TOKEN = Refusal(ErrorCode.BAD_TOKEN, "unknown or revoked token")


def expired(principal: Principal, now: dt.datetime | None = None) -> Refusal | None:
    """The refusal of a token past its expiry, else None."""
    if principal.expires_at is None or (now or utcnow()) < principal.expires_at:
        return None
    from turnout.dashboard.invocation import turnout_here

    return Refusal(
        ErrorCode.TOKEN_EXPIRED,
        f"token {principal.prefix}… ({principal.name}) expired at "
        f"{principal.expires_at:%Y-%m-%d %H:%M} UTC; make a new one with "
        f"`{turnout_here()} token create --role {principal.role}`",
    )


class TokenVerifier:
    """Looks tokens up by hash, caching hits and misses for ``ttl_s`` seconds; looks page
    sessions up every time."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = session_factory
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, Principal | Refusal]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> tuple[bool, Principal | Refusal]:
        """(hit, principal or refusal) without touching the database."""
        key = tokens.hash_token(token)
        with self._lock:
            entry = self._cache.get(key)
        if entry is not None and self._clock() - entry[0] < self._ttl_s:
            return True, _still_valid(entry[1])
        return False, UNKNOWN_TOKEN

    def authenticate(self, token: str) -> Principal | Refusal:
        """The principal for ``token``, or why not (unknown, revoked, expired); may query
        the store."""
        hit, result = self.cached(token)
        if hit:
            return result
        with self._sessions() as session:
            row = tokens.find_token(session=session, token=token)
            result = (
                UNKNOWN_TOKEN if row is None or row.revoked_at is not None else (Principal.of(row))
            )
        with self._lock:
            if len(self._cache) > 10_000:  # bad tokens must not grow memory without bound
                self._cache.clear()
            self._cache[tokens.hash_token(token)] = (self._clock(), result)
        return _still_valid(result)

    def verify(self, token: str) -> Principal | None:
        """The principal for a live ``token``, or None."""
        result = self.authenticate(token)
        return result if isinstance(result, Principal) else None

    def session_principal(self, session_id: str) -> Principal | None:
        """The principal of a live page session (None: unknown, ended, expired, or its token
        revoked or expired)."""
        with self._sessions() as session:
            live = sessions.find_session(session=session, session_id=session_id)
            return None if live is None else Principal.of(live.token)

    def forget_all(self) -> None:
        with self._lock:
            self._cache.clear()


def _still_valid(result: Principal | Refusal) -> Principal | Refusal:
    if isinstance(result, Principal):
        return expired(result) or result
    return result


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _mac(key: str, purpose: bytes, text: bytes = b"") -> str:
    return hmac.new(key.encode(), purpose + b"\0" + text, hashlib.sha256).hexdigest()[:32]


def same_secret(expected: str, submitted: str) -> bool:
    """True when ``submitted`` equals ``expected``, compared in constant time as UTF-8 bytes.

    Any text compares, whatever it holds: ``hmac.compare_digest`` raises TypeError on a str
    with a non-ASCII character, which a form field, a cookie or a query parameter may carry.
    Lone surrogates (``surrogatepass``) encode too, so nothing a request can send raises."""
    return hmac.compare_digest(
        expected.encode("utf-8", "surrogatepass"), submitted.encode("utf-8", "surrogatepass")
    )


def csrf_token(session_id: str) -> str:
    """The CSRF field value of a signed-in page session (bound to its id)."""
    return _mac(session_id, b"turnout-csrf")


def csrf_ok(session_id: str, submitted: str | None) -> bool:
    return (
        bool(session_id)
        and submitted is not None
        and same_secret(csrf_token(session_id), submitted)
    )


def new_sign_in_nonce() -> str:
    """The value the sign-in form and its cookie both carry."""
    return secrets.token_urlsafe(24)


def sign_in_nonce_ok(cookie: str | None, submitted: str) -> bool:
    return bool(cookie) and bool(submitted) and same_secret(cookie or "", submitted)


def same_origin(origin: str | None, host: str | None) -> bool:
    """True when a form's ``Origin`` (absent: not sent, as by programs and older browsers)
    names the host it was sent to (its scheme may differ behind a TLS proxy)."""
    if origin is None:
        return True
    return bool(host) and urlsplit(origin).netloc.lower() == (host or "").lower()


def flash_signature(session_id: str, message: str, error: str) -> str:
    """The signature of a page's status line (``/canaries?message=…&error=…&sig=…``), bound
    to the signed-in session: a link made by anyone else shows no status line."""
    return _mac(session_id, b"turnout-flash", f"{message}\0{error}".encode())


def flash_ok(session_id: str, message: str, error: str, submitted: str) -> bool:
    return bool(session_id) and same_secret(flash_signature(session_id, message, error), submitted)
