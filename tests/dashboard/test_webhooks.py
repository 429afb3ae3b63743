"""Webhook deliveries from the outbox to a real local receiver (a threaded http.server), on
SQLite and PostgreSQL, at explicit times: signed bodies, retries with backoff and jitter,
dead letters and their retry, leases that outlive a killed worker."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator

import pytest
from webhook_receiver import Receiver

from dashboard.store import canaries, delivery
from dashboard.store import webhooks as hooks
from dashboard.store.canaries import CohortDefault
from dashboard.store.db import Database
from dashboard.store.errors import Conflict, InvalidChange
from dashboard.webhook_signing import signature, verify

SECRET = "whsec_test_secret_0123456789"
# Passes run an hour after the events (flipped at the real time): every new delivery is due.
T0 = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
POLICY = delivery.RetryPolicy(max_attempts=4, backoff_s=10, max_backoff_s=25, lease_s=60,
                              timeout_s=5)


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
        hooks.add_webhook(session=s, url=receiver.url, kinds=["flip", "kill_switch"],
                          actor="t", secret=SECRET)
        s.commit()
    yield database
    database.dispose()


def _flip(db: Database, enabled: bool = True) -> None:
    with db.write_session() as s:
        version = canaries.get_canary(session=s, cohort="qwen3").version
        canaries.flip_canary(session=s, cohort="qwen3", enabled=enabled, reason="parity green",
                             actor="alice (token 2)", if_version=version)
        s.commit()


def _deliver(db: Database, now: dt.datetime, seed: int = 1) -> delivery.DeliveryReport:
    with db.write_session() as s:
        return delivery.deliver_due(session=s, now=now, post=delivery.httpx_poster(5),
                                    policy=POLICY, rng=random.Random(seed))


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
        "canary.flip", "qwen3", "parity green")
    assert got.body["after"] == {"enabled": True, "percentage": 100, "version": 2}
    assert _deliver(db, T0 + dt.timedelta(hours=1)).delivered == []
    entry = _entry(db)
    assert (entry.state, entry.num_attempts, entry.last_status) == ("delivered", 1, 204)


def test_a_receiver_failing_twice_gets_it_on_the_third_attempt(db: Database,
                                                               receiver: Receiver) -> None:
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
        db: Database, receiver: Receiver) -> None:
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


def test_a_receiver_that_is_down_gets_it_once_it_is_back(db: Database,
                                                         receiver: Receiver) -> None:
    receiver.stop()
    _flip(db)
    report = _deliver(db, T0)
    assert len(report.retried) == 1 and "ConnectError" in (_entry(db).last_error or "")
    receiver.start()  # the same port
    assert len(_deliver(db, _entry(db).next_attempt_at).delivered) == 1
    assert len(receiver.deliveries) == 1


def test_a_worker_killed_mid_delivery_leaves_it_to_the_next_once_its_lease_ends(
        db: Database, receiver: Receiver) -> None:
    _flip(db)
    with db.write_session() as s:
        [claimed] = delivery._claim(s, T0, POLICY, 10)  # taken, then the process dies
    assert _deliver(db, T0 + dt.timedelta(seconds=30)).delivered == []  # leased
    report = _deliver(db, claimed.lease)
    assert report.delivered == [claimed.delivery_id] and len(receiver.deliveries) == 1


def test_removing_a_subscription_ends_its_pending_deliveries(db: Database,
                                                             receiver: Receiver) -> None:
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
        for url, kinds, what in [("ftp://x/y", ["flip"], "not an http"),
                                 ("http:///nohost", ["flip"], "not an http"),
                                 ("http://h/x", [], "at least one kind"),
                                 ("http://h/x", ["flips"], "unknown event kind")]:
            with pytest.raises(InvalidChange, match=what):
                hooks.add_webhook(session=s, url=url, kinds=kinds, actor="t")
        row, secret = hooks.add_webhook(session=s, url="https://h/x", actor="t",
                                        kinds=["approval", "flip", "flip"])
    assert row.kinds == ["flip", "approval"] and secret.startswith("whsec_")


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
    for kwargs in [{"body": body + b" "}, {"secret": SECRET + "x"}, {"now": ts + 301},
                   {"timestamp": "x"}, {"timestamp": None}, {"sig": None},
                   {"timestamp": "9" * 40}]:
        args = {"secret": SECRET, "body": body, "timestamp": str(ts), "sig": sig,
                "now": ts, **kwargs}
        assert not verify(**args), kwargs  # type: ignore[arg-type]


def test_the_docs_verification_example_accepts_a_real_delivery_only() -> None:
    import re
    import time
    from pathlib import Path

    from dashboard.webhook_signing import signed_headers

    doc = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    section = doc[doc.index("### Verifying a delivery"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    scope: dict[str, object] = {}
    exec(code.group(1), scope)
    verify_delivery = scope["verify_delivery"]
    body = b'{"kind":"gate_failure"}'
    headers = signed_headers(secret=SECRET, timestamp=int(time.time()), body=body,
                             kind="gate_failure", delivery_id="d1")
    assert verify_delivery(SECRET, headers, body)  # type: ignore[operator]
    assert not verify_delivery(SECRET, headers, body + b" ")  # type: ignore[operator]
    assert not verify_delivery("whsec_another_secret_xx", headers, body)  # type: ignore[operator]
    old = signed_headers(secret=SECRET, timestamp=int(time.time()) - 3600, body=body,
                         kind="gate_failure", delivery_id="d1")
    assert not verify_delivery(SECRET, old, body)  # type: ignore[operator]
