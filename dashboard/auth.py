"""Bearer-token authentication and role checks.

Clients send ``Authorization: Bearer tok_...``; the pages send the same token from an HttpOnly,
SameSite=Strict cookie set by the sign-in form, and their forms carry a CSRF field derived from
it. Verified tokens are cached in memory for ``token_cache_ttl_s`` (a revocation takes effect
within that time) so that hot read paths such as ``POST /decide`` need no database round trip.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from dashboard.store import tokens
from dashboard.store.tokens import Role

COOKIE_NAME = "turnout_token"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name, id and role."""

    name: str
    token_id: int
    role: Role

    @property
    def actor(self) -> str:
        return f"{self.name} (token {self.token_id})"


class TokenVerifier:
    """Looks tokens up by hash, caching hits and misses for ``ttl_s`` seconds."""

    def __init__(self, session_factory: sessionmaker[Session], ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions = session_factory
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """(hit, principal) without touching the database."""
        key = tokens.hash_token(token)
        with self._lock:
            entry = self._cache.get(key)
        if entry is not None and self._clock() - entry[0] < self._ttl_s:
            return True, entry[1]
        return False, None

    def verify(self, token: str) -> Principal | None:
        """The principal for ``token`` (None when unknown or revoked); may query the store."""
        hit, principal = self.cached(token)
        if hit:
            return principal
        with self._sessions() as session:
            row = tokens.verify_token(session=session, token=token)
            principal = None if row is None else Principal(row.name, row.id, Role(row.role))
        with self._lock:
            if len(self._cache) > 10_000:  # bad tokens must not grow memory without bound
                self._cache.clear()
            self._cache[tokens.hash_token(token)] = (self._clock(), principal)
        return principal

    def forget_all(self) -> None:
        with self._lock:
            self._cache.clear()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def csrf_token(token: str) -> str:
    """The CSRF field value for a signed-in page session (bound to its token)."""
    return hmac.new(token.encode(), b"turnout-csrf", hashlib.sha256).hexdigest()[:32]


def csrf_ok(token: str, submitted: str | None) -> bool:
    return submitted is not None and hmac.compare_digest(csrf_token(token), submitted)


def flash_signature(token: str, message: str, error: str) -> str:
    """The signature of a page's status line (``/canaries?message=…&error=…&sig=…``), bound
    to the signed-in token: a link made by anyone else shows no status line."""
    text = f"{message}\0{error}".encode()
    return hmac.new(token.encode(), b"turnout-flash\0" + text, hashlib.sha256).hexdigest()[:32]


def flash_ok(token: str, message: str, error: str, submitted: str) -> bool:
    return bool(token) and hmac.compare_digest(flash_signature(token, message, error),
                                               submitted)
