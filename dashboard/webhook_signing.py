"""Webhook signatures: what the service sends with each delivery, and how a receiver checks it.

Every delivery is a ``POST`` of a JSON body with these headers:

- ``X-Turnout-Timestamp``: the attempt's time, Unix seconds (an integer, as text);
- ``X-Turnout-Signature``: ``sha256=`` and the lowercase hex HMAC-SHA256, keyed with the
  subscription's secret (its UTF-8 bytes), of ``timestamp + "." + body`` (the body's exact
  bytes);
- ``X-Turnout-Event``: the event kind (``flip``, ``ramp_step``, ...);
- ``X-Turnout-Delivery``: the delivery's id, the same on every retry of it (deduplicate on it).

A receiver recomputes the HMAC over the bytes it received, compares in constant time, and
refuses a timestamp too far from its clock (a replayed old delivery). Only the standard
library is needed; this module imports nothing else, so a receiver may copy it.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Turnout-Signature"
TIMESTAMP_HEADER = "X-Turnout-Timestamp"
EVENT_HEADER = "X-Turnout-Event"
DELIVERY_HEADER = "X-Turnout-Delivery"
#: How far a delivery's timestamp may be from the receiver's clock, seconds (the default).
TOLERANCE_S = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``b"<timestamp>." + body`` keyed with ``secret``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signed_headers(
    *, secret: str, timestamp: int, body: bytes, kind: str, delivery_id: str
) -> dict[str, str]:
    """The headers of one delivery attempt (Content-Type included)."""
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(secret, timestamp, body),
        EVENT_HEADER: kind,
        DELIVERY_HEADER: delivery_id,
    }


def verify(
    *,
    secret: str,
    body: bytes,
    timestamp: str | None,
    sig: str | None,
    now: float,
    tolerance_s: float = TOLERANCE_S,
) -> bool:
    """True when ``sig`` (the ``X-Turnout-Signature`` header) signs ``body`` at ``timestamp``
    (the ``X-Turnout-Timestamp`` header) with ``secret``, and the timestamp lies within
    ``tolerance_s`` seconds of ``now`` (Unix seconds). A missing or malformed header is
    False, never an exception."""
    if not timestamp or not sig or not (timestamp.isascii() and timestamp.isdigit()):
        return False
    if len(timestamp) > 12 or abs(now - int(timestamp)) > tolerance_s:
        return False
    # As bytes: compare_digest raises TypeError on a str with a non-ASCII character, and a
    # header may carry any (this module imports nothing of turnout's, so a receiver may copy
    # it: it does not use turnout.dashboard.auth.same_secret).
    return hmac.compare_digest(
        signature(secret, int(timestamp), body).encode(), sig.encode("utf-8", "surrogatepass")
    )
