"""Webhooks from a running service (``turnout serve``, its delivery worker in the lifespan) to a
real receiver (a threaded http.server in the test): one that fails its first attempts, and one
that is down while the service is killed (SIGKILL) and started again: the delivery written
with the flip survives and arrives, signed, once both are back."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from service_helpers import LOOPBACK_EGRESS, LiveService, free_port, make_tokens, start_service
from webhook_receiver import Receiver, StallingReceiver

SECRET = "whsec_live_secret_0123456789"
FAST = {
    "TURNOUT_WEBHOOK_POLL_S": "0.1",
    "TURNOUT_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",  # the receivers here are local
    "TURNOUT_WEBHOOK_BACKOFF_S": "0.2",
    "TURNOUT_WEBHOOK_MAX_BACKOFF_S": "0.5",
    "TURNOUT_WEBHOOK_MAX_ATTEMPTS": "100",
    "TURNOUT_WEBHOOK_LEASE_S": "1",
}


def _setup(tmp_path: Path) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    return url, make_tokens(url)


def _subscribe(svc: LiveService, tokens: dict[str, str], url: str) -> None:
    r = httpx.post(
        svc.url + "/api/v1/webhooks",
        headers=_h(tokens, "admin"),
        json={"url": url, "kinds": ["flip", "kill_switch"], "secret": SECRET},
    )
    assert r.status_code == 201, r.text


def _h(tokens: dict[str, str], role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens[role]}"}


def _outbox(svc: LiveService, tokens: dict[str, str]) -> dict[str, object]:
    return dict(httpx.get(svc.url + "/api/v1/webhooks/outbox", headers=_h(tokens, "admin")).json())


def _until(what: str, check: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_a_receiver_failing_at_first_gets_the_delivery_signed(
    tmp_path: Path, live: list[LiveService]
) -> None:
    receiver = Receiver(SECRET, fail_first=2).start()
    try:
        url, tokens = _setup(tmp_path)
        svc = start_service(url, tmp_path / "svc.log", env=FAST)
        live.append(svc)
        _subscribe(svc, tokens, receiver.url)
        r = httpx.post(
            svc.url + "/api/v1/kill-switch",
            headers=_h(tokens, "operator"),
            json={"engaged": True, "reason": "V2 crash loop"},
        )
        assert r.status_code == 200
        [got] = receiver.wait_for(1)
        assert got.signed and got.kind == "kill_switch" and got.body["reason"] == "V2 crash loop"
        assert receiver.attempts == 3
        _until(
            "the outbox says delivered",
            lambda: _outbox(svc, tokens)["counts"] == {"pending": 0, "delivered": 1, "dead": 0},
        )
        entry = _outbox(svc, tokens)["entries"][0]  # type: ignore[index]
        assert entry["num_attempts"] == 3 and entry["last_status"] == 204
    finally:
        receiver.stop()


def test_a_delivery_survives_a_killed_service_and_a_receiver_that_was_down(
    tmp_path: Path, live: list[LiveService]
) -> None:
    receiver = Receiver(SECRET, port=free_port())  # not started: down
    url, tokens = _setup(tmp_path)
    svc = start_service(url, tmp_path / "svc.log", env=FAST)
    live.append(svc)
    _subscribe(svc, tokens, receiver.url)
    cohort = svc.url + "/api/v1/canaries/llama-mistral-dense"
    etag = httpx.get(cohort, headers=_h(tokens, "viewer")).headers["ETag"]
    r = httpx.patch(
        cohort,
        headers={**_h(tokens, "operator"), "If-Match": etag},
        json={"enabled": True, "percentage": 10, "reason": "10% first"},
    )
    assert r.status_code == 200, r.text

    def tried() -> bool:
        entries = _outbox(svc, tokens)["entries"]
        return bool(entries) and entries[0]["num_attempts"] >= 1  # type: ignore[index]

    _until("a failed attempt", tried)
    assert "ConnectError" in _outbox(svc, tokens)["entries"][0]["last_error"]  # type: ignore[index]
    svc.kill()
    receiver.start()
    try:
        again = start_service(url, tmp_path / "svc.log", env=FAST)
        live.append(again)
        [got] = receiver.wait_for(1)
        assert got.signed and got.kind == "flip"
        assert (got.body["cohort"], got.body["reason"]) == ("llama-mistral-dense", "10% first")
        assert got.body["after"] == {"enabled": True, "percentage": 10, "version": 2}
        _until(
            "the outbox says delivered",
            lambda: _outbox(again, tokens)["counts"] == {"pending": 0, "delivered": 1, "dead": 0},
        )
    finally:
        receiver.stop()


def test_a_stopping_service_starts_no_further_delivery(tmp_path: Path) -> None:
    """SIGTERM while the worker goes through deliveries to a receiver that never answers:
    the attempt under way ends (at its timeout) and no other starts; the rest wait, pending
    and not leased, for the next service. The pass went on to its end before, an attempt
    after another, holding the stop for up to its limit times the timeout."""
    from turnout.dashboard.store import canaries
    from turnout.dashboard.store import webhooks as hooks
    from turnout.dashboard.store.db import Database

    url, _tokens = _setup(tmp_path)
    stalling = StallingReceiver().start()
    db = Database(url)
    with db.write_session() as s:  # ten deliveries due before the service starts
        canaries.ensure_defaults(session=s, defaults=[])
        hooks.add_webhook(
            session=s,
            url=stalling.url,
            kinds=["kill_switch"],
            actor="t",
            secret=SECRET,
            egress=LOOPBACK_EGRESS,
        )
        for i in range(10):
            canaries.set_kill_switch(session=s, engaged=i % 2 == 0, reason=f"drill {i}", actor="t")
        s.commit()
    svc = start_service(
        url,
        tmp_path / "svc.log",
        env={**FAST, "TURNOUT_WEBHOOK_TIMEOUT_S": "1", "TURNOUT_WEBHOOK_LEASE_S": "2"},
    )
    try:
        _until("two attempts", lambda: len(stalling.attempts) >= 2)
        svc.proc.terminate()
        svc.proc.wait(120)  # a hang detector
        assert len(stalling.attempts) <= 3, stalling.attempts
        with db.read_session() as s:
            rows = hooks.list_outbox(session=s)
        waiting = [r for r in rows if r.num_attempts == 0]
        assert len(waiting) >= 7 and all(
            r.state == "pending" and r.leased_until is None for r in waiting
        )
    finally:
        svc.stop()
        stalling.stop()
        db.dispose()
