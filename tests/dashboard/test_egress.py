"""Webhooks go to public addresses only, unless ``TURNOUT_WEBHOOK_ALLOW_NETWORKS`` lists more:
refused when added (address literals in every form the resolver reads) and again at delivery,
on what the host resolves to then (a name for loopback), with the connection made to the
address checked. On SQLite and PostgreSQL; a real local receiver."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator

import pydantic
import pytest
from service_helpers import LOOPBACK_EGRESS, Api
from webhook_receiver import Receiver

from turnout.dashboard.egress import EgressPolicy, EgressRefused
from turnout.dashboard.settings import Settings
from turnout.dashboard.store import canaries, delivery
from turnout.dashboard.store import webhooks as hooks
from turnout.dashboard.store.canaries import CohortDefault
from turnout.dashboard.store.db import Database

SECRET = "whsec_test_secret_0123456789"

# Before: every one of these was accepted, and the service POSTed to it from inside its network.
REFUSED = [
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://[::ffff:169.254.169.254]/", "cloud metadata"),
    ("http://[fd00:ec2::254]/", "cloud metadata"),
    ("http://0x7f000001/hook", "loopback"),  # 127.0.0.1 as the C resolver reads it
    ("http://2130706433/hook", "loopback"),
    ("http://0177.0.0.1/hook", "loopback"),
    ("http://127.1/hook", "loopback"),
    ("http://[::1]:8080/hook", "loopback"),
    ("http://[::ffff:127.0.0.1]/hook", "loopback"),
    ("http://[2002:7f00:1::]/hook", "loopback"),  # 6to4 carrying 127.0.0.1
    ("https://10.0.0.7/hook", "private"),
    ("https://192.168.1.20/hook", "private"),
    ("https://172.16.5.4/hook", "private"),
    ("https://100.64.0.1/hook", "not a public one"),  # shared address space (CGNAT)
    ("http://[fe80::1]/hook", "link-local"),
    ("http://224.0.0.1/hook", "multicast"),
    ("http://0.0.0.0/hook", "unspecified"),
    # IPv4 inside IPv6 by other routes (a breaker round found these taken)
    ("http://[::7f00:1]/hook", "loopback"),  # IPv4-compatible
    ("http://[64:ff9b::a9fe:a9fe]/", "cloud metadata"),  # NAT64 of 169.254.169.254
    ("http://[::ffff:0:a9fe:a9fe]/", "cloud metadata"),  # SIIT
    ("http://192.0.0.8/hook", "special-purpose"),
]


@pytest.mark.parametrize(("url", "kind"), REFUSED)
def test_a_refused_address_cannot_be_subscribed(api: Api, url: str, kind: str) -> None:
    body = {"url": url, "kinds": ["flip"]}
    r = api.client.post("/api/v1/webhooks", json=body, headers=api.h("admin"))
    assert r.status_code == 422, r.text
    message = r.json()["detail"]["message"]
    assert kind in message and "TURNOUT_WEBHOOK_ALLOW_NETWORKS" in message, message
    assert api.client.get("/api/v1/webhooks", headers=api.h("admin")).json() == []


def test_public_addresses_and_names_are_taken(api: Api) -> None:
    for url in ("https://93.184.216.34/hook", "https://[2606:4700::1111]/h", "https://hooks.ex/h"):
        r = api.client.post(
            "/api/v1/webhooks", json={"url": url, "kinds": ["flip"]}, headers=api.h("admin")
        )
        assert r.status_code == 201, (url, r.text)


def test_an_allowed_network_takes_its_addresses_in_every_form() -> None:
    policy = EgressPolicy.parse("127.0.0.0/8, 10.1.2.3")
    for host in ("127.0.0.1", "0x7f000001", "[::ffff:127.0.0.1]", "10.1.2.3"):
        policy.check_host(host)
    with pytest.raises(EgressRefused, match=r"10\.1\.2\.4 is a private address"):
        policy.check_host("10.1.2.4")
    with pytest.raises(EgressRefused, match="cloud metadata"):
        policy.check_host("169.254.169.254")


def test_a_bad_allow_list_is_named_at_start() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"'10\.0\.0\.300' is not a network"):
        Settings(webhook_allow_networks="127.0.0.0/8, 10.0.0.300")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET, tolerance_s=2 * 86_400).start()
    yield r
    r.stop()


def _deliver_flip(db_url: str, url: str, egress: EgressPolicy) -> delivery.DeliveryReport:
    database = Database(db_url)
    database.upgrade()
    try:
        with database.write_session() as s:
            canaries.ensure_defaults(session=s, defaults=[CohortDefault("qwen3", False)])
            hooks.add_webhook(
                session=s, url=url, kinds=["flip"], actor="t", secret=SECRET, egress=egress
            )
            version = canaries.get_canary(session=s, cohort="qwen3").version
            canaries.flip_canary(
                session=s,
                cohort="qwen3",
                enabled=True,
                reason="parity green",
                actor="alice",
                if_version=version,
            )
            s.commit()
        with database.write_session() as s:
            return delivery.deliver_due(
                session=s,
                now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
                post=delivery.httpx_poster(5, egress),
                policy=delivery.RetryPolicy(
                    max_attempts=1, backoff_s=1, max_backoff_s=1, lease_s=60, timeout_s=5
                ),
                rng=random.Random(1),
            )
    finally:
        database.dispose()


def test_a_name_for_loopback_is_refused_at_delivery(db_url: str, receiver: Receiver) -> None:
    # "localhost" is a name: taken when added, refused when it resolves to loopback.
    url = receiver.url.replace("127.0.0.1", "localhost")
    report = _deliver_flip(db_url, url, EgressPolicy())
    assert report.dead and not report.delivered
    assert receiver.attempts == 0  # nothing reached the receiver
    with Database(db_url).read_session() as s:
        [entry] = hooks.list_outbox(session=s, limit=5)
    assert "EgressRefused" in (entry.last_error or "") and "loopback" in (entry.last_error or "")


def test_an_allowed_name_is_delivered_to_the_address_checked(
    db_url: str, receiver: Receiver
) -> None:
    url = receiver.url.replace("127.0.0.1", "localhost")
    report = _deliver_flip(db_url, url, LOOPBACK_EGRESS)
    assert len(report.delivered) == 1
    [got] = receiver.deliveries
    assert got.signed and got.kind == "flip"
    assert got.host == f"localhost:{receiver.port}"  # the URL's Host, sent to 127.0.0.1
