"""Delivering the webhook outbox: signed POSTs, retried with exponential backoff and jitter,
dead-lettered after the last attempt.

:func:`deliver_due` is one pass over the entries due at an explicit time ``now``: it takes
each under a lease as its attempt starts (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas
share the work; SQLite's write transactions are exclusive), commits, sends it with no
transaction open (within the timeout in all), then records the outcome in a transaction of
its own. A process killed in between leaves its entry leased;
another pass takes them again once the lease ends, so a delivery is sent at least once
(receivers deduplicate on ``X-Turnout-Delivery``) and none is lost.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from turnout.dashboard.egress import EgressPolicy
from turnout.dashboard.store.models_rollout import OutboxEntry, Webhook
from turnout.dashboard.store.webhooks import OutboxState
from turnout.dashboard.webhook_signing import signed_headers

#: ``(url, body, headers) -> HTTP status``; raises for a transport failure (refused, timeout).
Poster = Callable[[str, bytes, dict[str, str]], int]
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` attempts in all; before attempt n+1 the entry waits
    ``d/2 + uniform(0, d/2)`` seconds with ``d = min(max_backoff_s, backoff_s * 2**(n-1))``
    (exponential backoff with "equal jitter": receivers that failed together do not come back
    together, and no wait is under half its step)."""

    max_attempts: int = 8
    backoff_s: float = 5.0
    max_backoff_s: float = 3600.0
    lease_s: float = 60.0
    timeout_s: float = 5.0

    def delay_s(self, num_attempts: int, rng: random.Random) -> float:
        step = min(self.max_backoff_s, self.backoff_s * 2.0 ** max(num_attempts - 1, 0))
        return step / 2 + rng.uniform(0, step / 2)


@dataclass
class DeliveryReport:
    """What one pass did: delivery ids sent (2xx), retried later, dead-lettered."""

    delivered: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)


def httpx_poster(timeout_s: float, egress: EgressPolicy) -> Poster:
    """A :data:`Poster` over httpx: each attempt has ``timeout_s`` seconds in all to get the
    answer's status (httpx's own timeouts bound each read, and a receiver sending a byte at a
    time would hold the worker for ever: ``oracle.client_http.status_within`` cuts the
    connection at the deadline); the answer's body is not read. Redirects are not followed: a
    3xx is a failure.

    The host is resolved first and every address checked against ``egress``
    (``dashboard.egress``); the connection then goes to the address checked, with the URL's
    ``Host`` header and, over TLS, its name for SNI and the certificate check (a DNS answer
    that changes in between reaches nothing). A refused address raises ``EgressRefused``: the
    attempt fails, naming it. Resolving is the system resolver's, outside ``timeout_s``."""
    import httpx

    from turnout.oracle.client_http import status_within

    def post(url: str, body: bytes, headers: dict[str, str]) -> int:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = egress.resolve(host, port)
        literal = f"[{address}]" if ":" in address else address
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{literal}:{port}" if userinfo else f"{literal}:{port}"
        target = urlunsplit(parts._replace(netloc=netloc))
        sent = {**headers, "Host": parts.netloc.rpartition("@")[2]}
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        with httpx.Client(
            timeout=timeout_s,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as http:
            return status_within(
                http,
                "POST",
                target,
                deadline_s=timeout_s,
                content=body,
                headers=sent,
                extensions=extensions,
            )

    return post


def body_of(entry: OutboxEntry) -> bytes:
    """The exact bytes sent (and signed): compact JSON, keys sorted."""
    return json.dumps(entry.payload, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class _Claimed:
    """An entry taken under a lease, as values (the ORM row is refreshed when its outcome is
    recorded, so the lease it was taken with is kept here)."""

    entry_id: int
    delivery_id: str
    kind: str
    body: bytes
    url: str
    secret: str
    lease: dt.datetime


def _claim(
    session: Session,
    now: dt.datetime,
    policy: RetryPolicy,
    limit: int,
    due: dt.datetime | None = None,
) -> list[_Claimed]:
    """Up to ``limit`` entries due at ``due`` (default ``now``) and not leased at ``now``,
    leased from ``now`` for ``lease_s`` (at least twice the attempt's timeout, so that an
    attempt ends within its lease); commits."""
    due = due or now
    stmt = (
        select(OutboxEntry)
        .where(
            OutboxEntry.state == OutboxState.pending,
            OutboxEntry.next_attempt_at <= due,
            or_(OutboxEntry.leased_until.is_(None), OutboxEntry.leased_until <= now),
        )
        .order_by(OutboxEntry.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    rows = list(session.scalars(stmt))
    lease = now + dt.timedelta(seconds=max(policy.lease_s, 2 * policy.timeout_s))
    out = []
    for row in rows:
        row.leased_until = lease
        hook = session.get(Webhook, row.webhook_id)
        assert hook is not None  # a foreign key
        out.append(
            _Claimed(row.id, row.delivery_id, row.kind, body_of(row), hook.url, hook.secret, lease)
        )
    session.commit()
    return out


def _attempt(post: Poster, claimed: _Claimed, now: dt.datetime) -> tuple[int | None, str | None]:
    """(status, error) of one attempt; error None for a 2xx."""
    headers = signed_headers(
        secret=claimed.secret,
        timestamp=int(now.timestamp()),
        body=claimed.body,
        kind=claimed.kind,
        delivery_id=claimed.delivery_id,
    )
    try:
        status = post(claimed.url, claimed.body, headers)
    except Exception as err:  # any transport failure is the receiver's, and retried
        return None, f"{type(err).__name__}: {err}"[:MAX_ERROR_CHARS]
    return status, None if 200 <= status < 300 else f"HTTP {status}"


def _record(
    session: Session,
    claimed: _Claimed,
    outcome: tuple[int | None, str | None],
    now: dt.datetime,
    policy: RetryPolicy,
    rng: random.Random,
    report: DeliveryReport,
) -> None:
    row = session.scalars(
        select(OutboxEntry)
        .where(OutboxEntry.id == claimed.entry_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    if row.state != OutboxState.pending or row.leased_until != claimed.lease:
        session.rollback()  # another worker took it after our lease ended, or an admin acted
        return
    status, error = outcome
    row.num_attempts += 1
    row.last_attempt_at, row.last_status, row.last_error = now, status, error
    row.leased_until = None
    if error is None:
        row.state, row.delivered_at = OutboxState.delivered.value, now
        report.delivered.append(row.delivery_id)
    elif row.num_attempts >= policy.max_attempts:
        row.state = OutboxState.dead.value
        report.dead.append(row.delivery_id)
    else:
        row.next_attempt_at = now + dt.timedelta(seconds=policy.delay_s(row.num_attempts, rng))
        report.retried.append(row.delivery_id)
    session.commit()


def deliver_due(
    *,
    session: Session,
    now: dt.datetime,
    post: Poster,
    policy: RetryPolicy | None = None,
    rng: random.Random | None = None,
    limit: int = 50,
    stopping: Callable[[], bool] = lambda: False,
) -> DeliveryReport:
    """Send every delivery due at ``now`` (at most ``limit``), oldest first, and record each
    outcome; commits (``session`` is a write session with no transaction open).

    Each entry is leased when its attempt starts, one at a time: a pass whose attempts wait on
    slow receivers takes longer than a lease, and entries leased with the whole batch at its
    start would be taken, and sent again, by another worker while this one is on its way to
    them. An attempt is signed, and its outcome recorded, at its own time: ``now`` plus the
    time the pass has taken so far. Once ``stopping()`` (the service stops), no further
    attempt starts: the rest wait, unleased, for the next pass of any worker."""
    policy = policy or RetryPolicy()
    rng = rng or random.Random()
    report = DeliveryReport()
    started = time.monotonic()
    for _ in range(limit):
        if stopping():
            break
        at = now + dt.timedelta(seconds=time.monotonic() - started)
        claimed = _claim(session, at, policy, 1, due=now)
        if not claimed:
            break
        outcome = _attempt(post, claimed[0], at)
        _record(
            session,
            claimed[0],
            outcome,
            now + dt.timedelta(seconds=time.monotonic() - started),
            policy,
            rng,
            report,
        )
    return report
