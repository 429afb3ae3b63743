"""Webhook deliveries from the outbox to a real local receiver (a threaded http.server), on
SQLite and PostgreSQL, at explicit times: signed bodies, retries with backoff and jitter,
dead letters and their retry, leases that outlive a killed worker."""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections.abc import Iterator

import pytest
from service_helpers import LOOPBACK_EGRESS
from webhook_receiver import Receiver, StallingReceiver

from turnout.dashboard.store import canaries, delivery
from turnout.dashboard.store import webhooks as hooks
from turnout.dashboard.store.canaries import CohortDefault
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.errors import Conflict, InvalidChange
from turnout.dashboard.webhook_signing import signature, verify

SECRET = "whsec_test_secret_0123456789"
# Passes run an hour after the events (flipped at the real time): every new delivery is due.
T0 = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
POLICY = delivery.RetryPolicy(
    max_attempts=4, backoff_s=10, max_backoff_s=25, lease_s=60, timeout_s=5
)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET, tolerance_s=2 * 86_400).start()
    yield r
    r.stop()


@pytest.fixture
def db(db_url: str, receiver: Receiver) -> Iterator[Database]:
    database = Database(db_url)
    database.upgrade()
    with database.write_session() as s:
        canaries.ensure_defaults(session=s, defaults=[CohortDefault("qwen3", False)])
        hooks.add_webhook(
            egress=LOOPBACK_EGRESS,
            session=s,
            url=receiver.url,
            kinds=["flip", "kill_switch"],
            actor="t",
            secret=SECRET,
        )
        s.commit()
    yield database
    database.dispose()


def _flip(db: Database, enabled: bool = True) -> None:
    with db.write_session() as s:
        version = canaries.get_canary(session=s, cohort="qwen3").version
        canaries.flip_canary(
            session=s,
            cohort="qwen3",
            enabled=enabled,
            reason="parity green",
            actor="alice (token 2)",
            if_version=version,
        )
        s.commit()


def _deliver(db: Database, now: dt.datetime, seed: int = 1) -> delivery.DeliveryReport:
    with db.write_session() as s:
        return delivery.deliver_due(
            session=s,
            now=now,
            post=delivery.httpx_poster(5, LOOPBACK_EGRESS),
            policy=POLICY,
            rng=random.Random(seed),
        )


def _entry(db: Database) -> hooks.OutboxEntry:
    with db.read_session() as s:
        return hooks.list_outbox(session=s, limit=1)[0]


def test_a_flip_is_delivered_once_signed(db: Database, receiver: Receiver) -> None:
    _flip(db)
    report = _deliver(db, T0)
    assert len(report.delivered) == 1 and not report.retried
    [got] = receiver.deliveries
    assert got.signed and got.kind == "flip" and got.delivery_id == report.delivered[0]
    assert (got.body["action"], got.body["cohort"], got.body["reason"]) == (
        "canary.flip",
        "qwen3",
        "parity green",
    )
    assert got.body["after"] == {"enabled": True, "percentage": 100, "version": 2}
    assert _deliver(db, T0 + dt.timedelta(hours=1)).delivered == []
    entry = _entry(db)
    assert (entry.state, entry.num_attempts, entry.last_status) == ("delivered", 1, 204)


def test_a_receiver_failing_twice_gets_it_on_the_third_attempt(
    db: Database, receiver: Receiver
) -> None:
    receiver.fail_first = 2
    _flip(db)
    now = T0
    for attempt in (1, 2):
        report = _deliver(db, now)
        assert len(report.retried) == 1, report
        entry = _entry(db)
        step = min(POLICY.max_backoff_s, POLICY.backoff_s * 2 ** (attempt - 1))
        wait = (entry.next_attempt_at - now).total_seconds()
        assert step / 2 <= wait <= step and entry.last_error == "HTTP 503"
        assert _deliver(db, now + dt.timedelta(seconds=wait / 2)).retried == []  # not due
        now = entry.next_attempt_at
    assert len(_deliver(db, now).delivered) == 1
    assert receiver.attempts == 3 and len(receiver.deliveries) == 1
    assert _entry(db).num_attempts == 3


def test_the_last_failed_attempt_is_a_dead_letter_an_admin_can_retry(
    db: Database, receiver: Receiver
) -> None:
    receiver.fail_first = 10
    _flip(db)
    now = T0
    for _ in range(POLICY.max_attempts):
        report = _deliver(db, now)
        now = _entry(db).next_attempt_at
    assert len(report.dead) == 1
    with db.read_session() as s:
        assert hooks.outbox_counts(session=s) == {"pending": 0, "delivered": 0, "dead": 1}
    assert _deliver(db, now + dt.timedelta(days=1)).retried == []
    receiver.fail_first = 0
    with db.write_session() as s:
        hooks.retry_dead(session=s, entry_id=_entry(db).id, actor="admin", now=now)
        s.commit()
    assert len(_deliver(db, now).delivered) == 1 and receiver.deliveries[0].signed


def test_a_receiver_that_is_down_gets_it_once_it_is_back(db: Database, receiver: Receiver) -> None:
    receiver.stop()
    _flip(db)
    report = _deliver(db, T0)
    assert len(report.retried) == 1 and "ConnectError" in (_entry(db).last_error or "")
    receiver.start()  # the same port
    assert len(_deliver(db, _entry(db).next_attempt_at).delivered) == 1
    assert len(receiver.deliveries) == 1


def test_a_worker_killed_mid_delivery_leaves_it_to_the_next_once_its_lease_ends(
    db: Database, receiver: Receiver
) -> None:
    _flip(db)
    with db.write_session() as s:
        [claimed] = delivery._claim(s, T0, POLICY, 10)  # taken, then the process dies
    assert _deliver(db, T0 + dt.timedelta(seconds=30)).delivered == []  # leased
    report = _deliver(db, claimed.lease)
    assert report.delivered == [claimed.delivery_id] and len(receiver.deliveries) == 1


def _subscribe(db: Database, url: str) -> None:
    with db.write_session() as s:
        hooks.add_webhook(
            egress=LOOPBACK_EGRESS, session=s, url=url, kinds=["flip"], actor="t", secret=SECRET
        )
        s.commit()


def _deliver_in_thread(
    db: Database,
    policy: delivery.RetryPolicy,
    now: dt.datetime,
    reports: list[delivery.DeliveryReport],
) -> threading.Thread:
    def run() -> None:
        with db.write_session() as s:
            reports.append(
                delivery.deliver_due(
                    session=s,
                    now=now,
                    policy=policy,
                    post=delivery.httpx_poster(policy.timeout_s, LOOPBACK_EGRESS),
                )
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("trickle", ["headers", "body"])
def test_a_receiver_that_never_finishes_its_answer_holds_no_one_else(
    db: Database, receiver: Receiver, trickle: str
) -> None:
    """Headers that never end, or a 200 whose body never ends, a line at a time, trip no read
    timeout: the attempt has a deadline of its own (the timeout, in all), and the answer's
    body is never read (its 200 is a delivery). The pass held on to such an answer for ever
    before, and every subscription after it waited."""
    stalling = StallingReceiver(trickle=trickle).start()
    try:
        _subscribe(db, stalling.url)  # subscription 2, after the receiver's (1)
        _flip(db)
        _subscribe(db, receiver.url)  # 3 subscribes later: the second flip goes to 1, 2, 3
        _flip(db, enabled=False)
        policy = delivery.RetryPolicy(max_attempts=4, backoff_s=10, lease_s=60, timeout_s=1)
        reports: list[delivery.DeliveryReport] = []
        thread = _deliver_in_thread(db, policy, T0, reports)
        thread.join(120)  # a hang detector, not a time limit: the pass takes about 2 s
        assert not thread.is_alive(), "the pass is still reading the endless answer"
        [report] = reports
        stalled_ok = trickle == "body"
        assert (len(report.delivered), len(report.retried)) == ((5, 0) if stalled_ok else (3, 2)), (
            report
        )
        with db.read_session() as s:
            stalled = hooks.list_outbox(session=s, webhook_id=2)
        if not stalled_ok:
            assert {(e.state, e.last_status) for e in stalled} == {("pending", None)}
            assert all("no complete answer within 1 s" in (e.last_error or "") for e in stalled), [
                e.last_error for e in stalled
            ]
        assert len(receiver.deliveries) == 3 and len(stalling.attempts) == 2
    finally:
        stalling.stop()


def test_a_delivery_is_sent_by_one_worker_while_the_other_waits_on_a_slow_receiver(
    db: Database,
) -> None:
    """Two workers (replicas) at once, the receiver never answering: each attempt ends at the
    timeout, so a pass of several takes longer than a lease. An entry is leased when its
    attempt starts, not with the whole batch at the start of the pass: before, a second worker
    took the entries whose lease had ended while the first was still on its way to them, and
    sent them too."""
    policy = delivery.RetryPolicy(max_attempts=4, backoff_s=600, lease_s=2, timeout_s=1)
    reports: list[delivery.DeliveryReport] = []
    threads: list[threading.Thread] = []

    def second_worker(n: int) -> None:  # once the first has spent more than a lease
        if n == 3:
            threads.append(_deliver_in_thread(db, policy, dt.datetime.now(dt.UTC), reports))

    stalling = StallingReceiver(on_attempt=second_worker).start()
    try:
        with db.write_session() as s:  # only the stalling receiver
            hooks.remove_webhook(session=s, webhook_id=1, actor="t", reason="not this one")
            s.commit()
        _subscribe(db, stalling.url)
        for enabled in (True, False, True, False):
            _flip(db, enabled)
        threads.append(_deliver_in_thread(db, policy, dt.datetime.now(dt.UTC), reports))
        while len(threads) < 2 or any(t.is_alive() for t in threads):
            threads[-1].join(120)
            assert len(threads) == 2 or threads[0].is_alive(), stalling.attempts
        assert len(stalling.attempts) == 4 and len(set(stalling.attempts)) == 4, stalling.attempts
        assert sum(len(r.retried) for r in reports) == 4
    finally:
        stalling.stop()


def test_removing_a_subscription_ends_its_pending_deliveries(
    db: Database, receiver: Receiver
) -> None:
    _flip(db)
    with db.write_session() as s:
        hooks.remove_webhook(session=s, webhook_id=1, actor="admin", reason="moved")
        s.commit()
    assert _deliver(db, T0).delivered == []
    entry = _entry(db)
    assert (entry.state, entry.last_error) == ("dead", "the subscription was removed")
    with db.write_session() as s, pytest.raises(Conflict):
        hooks.retry_dead(session=s, entry_id=entry.id, actor="admin")


def test_kinds_and_urls_are_checked(db: Database) -> None:
    with db.write_session() as s:
        for url, kinds, what in [
            ("ftp://x/y", ["flip"], "not an http"),
            ("http:///nohost", ["flip"], "not an http"),
            ("http://[", ["flip"], "Invalid IPv6 URL"),
            ("http://h:99999/x", ["flip"], "Port out of range"),
            ("http://h:x/", ["flip"], "Port could not be cast"),
            ("http://a b/", ["flip"], "a space or control character"),
            ("http://h/\x00", ["flip"], "a space or control character"),
            ("http://h/x", [], "at least one kind"),
            ("http://h/x", ["flips"], "unknown event kind"),
        ]:
            with pytest.raises(InvalidChange, match=what):
                hooks.add_webhook(
                    egress=LOOPBACK_EGRESS, session=s, url=url, kinds=kinds, actor="t"
                )
        # bounds the store keeps, for the command line as for the API (PostgreSQL's
        # varchar refused them with a DataError traceback; SQLite stored them)
        with pytest.raises(InvalidChange, match="at most 256 characters"):
            hooks.add_webhook(
                egress=LOOPBACK_EGRESS,
                session=s,
                url="http://h/x",
                kinds=["flip"],
                actor="t",
                description="d" * 257,
            )
        with pytest.raises(InvalidChange, match="16 to 256 characters"):
            hooks.add_webhook(
                egress=LOOPBACK_EGRESS,
                session=s,
                url="http://h/x",
                kinds=["flip"],
                actor="t",
                secret="s" * 257,
            )
        row, secret = hooks.add_webhook(
            egress=LOOPBACK_EGRESS,
            session=s,
            url="https://h/x",
            actor="t",
            kinds=["approval", "flip", "flip"],
        )
    assert row.kinds == ["flip", "approval"] and secret.startswith("whsec_")
    with db.write_session() as s:  # the longest URL: its audit entry quotes it (it was a
        long_url = "https://h/" + "p" * (hooks.MAX_URL_CHARS - 10)  # REASON_TOO_LONG)
        row, _ = hooks.add_webhook(
            egress=LOOPBACK_EGRESS, session=s, url=long_url, actor="t", kinds=["flip"]
        )
        s.commit()
    assert row.url == long_url


@pytest.mark.parametrize("seed", range(5))
def test_backoff_doubles_up_to_its_cap_with_jitter_in_the_upper_half(seed: int) -> None:
    rng = random.Random(seed)
    policy = delivery.RetryPolicy(backoff_s=2, max_backoff_s=100)
    for n in range(1, 12):
        step = min(100, 2 * 2 ** (n - 1))
        assert step / 2 <= policy.delay_s(n, rng) <= step


def test_a_signature_verifies_only_for_its_body_secret_and_time() -> None:
    body, ts = b'{"kind":"flip"}', 1_790_000_000
    sig = signature(SECRET, ts, body)
    assert sig.startswith("sha256=") and len(sig) == 7 + 64
    assert verify(secret=SECRET, body=body, timestamp=str(ts), sig=sig, now=ts + 10)
    for kwargs in [
        {"body": body + b" "},
        {"secret": SECRET + "x"},
        {"now": ts + 301},
        {"timestamp": "x"},
        {"timestamp": None},
        {"sig": None},
        {"timestamp": "9" * 40},
        {"sig": "sha256=é" + "0" * 63},  # before: TypeError from compare_digest on non-ASCII
        {"sig": "\ud800"},
    ]:
        args = {
            "secret": SECRET,
            "body": body,
            "timestamp": str(ts),
            "sig": sig,
            "now": ts,
            **kwargs,
        }
        assert not verify(**args), kwargs  # type: ignore[arg-type]


def test_the_docs_verification_example_accepts_a_real_delivery_only() -> None:
    import re
    import time
    from pathlib import Path

    from turnout.dashboard.webhook_signing import signed_headers

    doc = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    section = doc[doc.index("### Verifying a delivery") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    scope: dict[str, object] = {}
    exec(code.group(1), scope)
    verify_delivery = scope["verify_delivery"]
    body = b'{"kind":"gate_failure"}'
    headers = signed_headers(
        secret=SECRET, timestamp=int(time.time()), body=body, kind="gate_failure", delivery_id="d1"
    )
    assert verify_delivery(SECRET, headers, body)  # type: ignore[operator]
    assert not verify_delivery(SECRET, headers, body + b" ")  # type: ignore[operator]
    assert not verify_delivery("whsec_another_secret_xx", headers, body)  # type: ignore[operator]
    old = signed_headers(
        secret=SECRET,
        timestamp=int(time.time()) - 3600,
        body=body,
        kind="gate_failure",
        delivery_id="d1",
    )
    assert not verify_delivery(SECRET, old, body)  # type: ignore[operator]
