"""Real service processes: 20 clients racing on one canary with If-Match, two replicas on one
PostgreSQL database, and ``kill -9`` during ingest or during flips losing no acknowledged event
or flip (the audit log stays in step with the canary versions)."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from service_helpers import LiveService, make_tokens, start_service
from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard.store.db import Database
from turnout.dashboard.store.models import AuditEntry, Canary, DecisionEvent
from turnout.oracle import load_pack

COHORT = load_pack("turnout").cohorts[0].id  # the first rollout stage
NUM_CLIENTS = 20
NUM_ROUNDS = 4


def _version(svc: LiveService, token: str) -> int:
    r = httpx.get(
        f"{svc.url}/api/v1/canaries/{COHORT}", headers={"Authorization": f"Bearer {token}"}
    )
    r.raise_for_status()
    return int(r.json()["version"])


def test_20_clients_race_one_winner_per_version(
    db_url: str, tmp_path: Path, live: list[LiveService]
) -> None:
    tokens = make_tokens(db_url)
    svc = start_service(db_url, tmp_path / "svc.log")
    live.append(svc)
    auth = {"Authorization": f"Bearer {tokens['operator']}"}
    wins = 0
    for rnd in range(NUM_ROUNDS):
        version = _version(svc, tokens["viewer"])
        barrier = threading.Barrier(NUM_CLIENTS)
        statuses: list[int] = []
        lock = threading.Lock()

        def flip(
            i: int,
            version: int = version,
            barrier: threading.Barrier = barrier,
            rnd: int = rnd,
            statuses: list[int] = statuses,
            lock: threading.Lock = lock,
        ) -> None:
            with httpx.Client(base_url=svc.url, timeout=30) as c:
                barrier.wait()
                # Round 0 turns the first stage (on by default) off: each round is a change.
                r = c.patch(
                    f"/api/v1/canaries/{COHORT}",
                    headers={**auth, "If-Match": f'"{version}"'},
                    json={"enabled": rnd % 2 == 1, "reason": f"round {rnd} client {i}"},
                )
            with lock:
                statuses.append(r.status_code)

        threads = [threading.Thread(target=flip, args=(i,)) for i in range(NUM_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses) == [200] + [409] * (NUM_CLIENTS - 1), statuses
        wins += 1
        assert _version(svc, tokens["viewer"]) == version + 1
    db = Database(db_url)
    with db.read_session() as s:
        entries = list(
            s.scalars(
                select(AuditEntry).where(AuditEntry.action == "canary.flip").order_by(AuditEntry.id)
            )
        )
    db.dispose()
    assert len(entries) == wins == NUM_ROUNDS
    # No lost update: each entry starts from the state the previous one left.
    for prev, cur in itertools.pairwise(entries):
        assert cur.before == prev.after
    assert [e.after["enabled"] for e in entries] == [r % 2 == 1 for r in range(NUM_ROUNDS)]


def test_two_replicas_on_one_postgresql_see_each_others_flips(
    pg_schema_url: str, tmp_path: Path, live: list[LiveService]
) -> None:
    tokens = make_tokens(pg_schema_url)
    env = {"TURNOUT_SNAPSHOT_TTL_S": "0"}
    a = start_service(pg_schema_url, tmp_path / "a.log", env=env)
    live.append(a)
    b = start_service(pg_schema_url, tmp_path / "b.log", env=env)
    live.append(b)
    op = {"Authorization": f"Bearer {tokens['operator']}"}
    spec = {"config": {"architecture": "Qwen3ForCausalLM"}}
    before_b = httpx.post(f"{b.url}/api/v1/decide", headers=op, json=spec).json()
    version = _version(a, tokens["viewer"])
    r = httpx.patch(
        f"{a.url}/api/v1/canaries/{COHORT}",
        headers={**op, "If-Match": str(version)},
        json={"enabled": not _enabled(b, tokens["viewer"]), "reason": "replica test"},
    )
    assert r.status_code == 200, r.text
    assert _version(b, tokens["viewer"]) == version + 1
    after_b = httpx.post(f"{b.url}/api/v1/decide", headers=op, json=spec).json()
    assert before_b["runner"] != after_b["runner"]
    # And back, flipped on B and seen on A; A's stale If-Match is refused.
    r = httpx.patch(
        f"{b.url}/api/v1/canaries/{COHORT}",
        headers={**op, "If-Match": str(version + 1)},
        json={"enabled": not _enabled(a, tokens["viewer"]), "reason": "and back"},
    )
    assert r.status_code == 200, r.text
    r = httpx.patch(
        f"{a.url}/api/v1/canaries/{COHORT}",
        headers={**op, "If-Match": str(version + 1)},
        json={"enabled": True, "reason": "stale"},
    )
    assert r.status_code == 409
    assert r.headers["ETag"] == f'"{version + 2}"'


def _enabled(svc: LiveService, token: str) -> bool:
    r = httpx.get(
        f"{svc.url}/api/v1/canaries/{COHORT}", headers={"Authorization": f"Bearer {token}"}
    )
    return bool(r.json()["enabled"])


def _events(n: int, run: str) -> list[dict[str, object]]:
    now = dt.datetime.now(dt.UTC).isoformat()
    return [
        {
            "event_id": f"{run}-{uuid.uuid4().hex}",
            "at": now,
            "deployment_id": f"dep-{i % 97}",
            "pack": "turnout",
            "family": "qwen3",
            "runner": "v1",
            "mode": "auto",
            "reason_code": "STATIC",
            "rule_ids": ["ngram_speculation"],
        }
        for i in range(n)
    ]


def test_kill_9_during_ingest_loses_no_acknowledged_event(
    db_url: str, tmp_path: Path, live: list[LiveService]
) -> None:
    tokens = make_tokens(db_url)
    svc = start_service(db_url, tmp_path / "svc.log")
    live.append(svc)
    acked: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def post(worker: int) -> None:
        with httpx.Client(
            base_url=svc.url, timeout=10, headers={"Authorization": f"Bearer {tokens['operator']}"}
        ) as c:
            while not stop.is_set():
                batch = _events(200, f"w{worker}")
                try:
                    r = c.post("/api/v1/decisions", json={"events": batch})
                except httpx.HTTPError:
                    return  # the service is gone: this batch was never acknowledged
                with lock:
                    if r.status_code == 200:
                        acked.extend(str(e["event_id"]) for e in batch)
                    else:
                        refused.append(f"{r.status_code} {r.text[:200]}")

    refused: list[str] = []
    workers = [threading.Thread(target=post, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    # Bounded: a service that refuses every batch must fail the test with its answers, not
    # spin until the suite's timeout (it did under a shifted clock).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with lock:
            if len(acked) >= 4_000:
                break
        threading.Event().wait(0.01)
    with lock:
        assert len(acked) >= 4_000, (len(acked), refused[:3])
    svc.kill()  # SIGKILL while batches are in flight
    stop.set()
    for w in workers:
        w.join(30)
    with lock:
        acked_ids = set(acked)
    db = Database(db_url)
    with db.read_session() as s:
        stored = set(s.scalars(select(DecisionEvent.event_id)))
    db.dispose()
    assert acked_ids and acked_ids <= stored, f"{len(acked_ids - stored)} acknowledged events lost"
    # The database opens cleanly after the crash and the service serves it again.
    again = start_service(db_url, tmp_path / "again.log")
    live.append(again)
    r = httpx.get(
        f"{again.url}/api/v1/fallbacks", headers={"Authorization": f"Bearer {tokens['viewer']}"}
    )
    assert r.status_code == 200 and r.json()["num_deployments"] == 97


def test_kill_9_during_flips_keeps_audit_and_versions_in_step(
    db_url: str, tmp_path: Path, live: list[LiveService]
) -> None:
    tokens = make_tokens(db_url)
    svc = start_service(db_url, tmp_path / "svc.log")
    live.append(svc)
    acked: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def flip(worker: int) -> None:
        with httpx.Client(
            base_url=svc.url, timeout=10, headers={"Authorization": f"Bearer {tokens['operator']}"}
        ) as c:
            while not stop.is_set():
                try:
                    cur = c.get(f"/api/v1/canaries/{COHORT}").json()
                    r = c.patch(
                        f"/api/v1/canaries/{COHORT}",
                        headers={"If-Match": str(cur["version"])},
                        json={"enabled": not cur["enabled"], "reason": f"w{worker}"},
                    )
                except httpx.HTTPError:
                    return  # the service is gone: this flip was never acknowledged
                assert r.status_code in (200, 409), r.text
                if r.status_code == 200:
                    with lock:
                        acked.append(int(r.json()["version"]))

    workers = [threading.Thread(target=flip, args=(w,)) for w in range(8)]
    for w in workers:
        w.start()
    while True:
        with lock:
            if len(acked) >= 40:
                break
        threading.Event().wait(0.01)
    svc.kill()  # SIGKILL while flips are in flight
    stop.set()
    for w in workers:
        w.join(30)
    db = Database(db_url)
    with db.read_session() as s:
        version = _stored_version(s)
        audited = sorted(
            int(a.after["version"])
            for a in s.scalars(select(AuditEntry).where(AuditEntry.target == f"cohort:{COHORT}"))
            if a.after
        )
    db.dispose()
    # One audit entry per committed flip, versions without gaps, every acknowledged one there.
    assert audited == list(range(2, version + 1))
    assert len(set(acked)) == len(acked) and set(acked) <= set(audited)
    again = start_service(db_url, tmp_path / "again.log")
    live.append(again)
    assert _version(again, tokens["viewer"]) == version


def _stored_version(session: Session) -> int:
    return int(session.scalars(select(Canary.version).where(Canary.cohort == COHORT)).one())


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


def test_workers_share_the_store_and_all_see_a_flip(
    tmp_path: Path, live: list[LiveService]
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    tokens = make_tokens(url)
    svc = start_service(
        url, tmp_path / "w.log", env={"TURNOUT_SNAPSHOT_TTL_S": "0"}, args=("--workers", "2")
    )
    live.append(svc)
    op = {"Authorization": f"Bearer {tokens['operator']}"}
    spec = {"config": {"architecture": "Qwen3ForCausalLM"}}
    with httpx.Client(base_url=svc.url, headers=op, timeout=10) as c:
        version = _version(svc, tokens["viewer"])
        before = c.post("/api/v1/decide", json=spec).json()["runner"]
        r = c.patch(
            f"/api/v1/canaries/{COHORT}",
            headers={"If-Match": str(version)},
            json={"enabled": not _enabled(svc, tokens["viewer"]), "reason": "workers"},
        )
        assert r.status_code == 200, r.text
        # New connections land on either worker; every answer must reflect the flip.
        runners = set()
        for _ in range(20):
            with httpx.Client(base_url=svc.url, headers=op, timeout=10) as fresh:
                runners.add(fresh.post("/api/v1/decide", json=spec).json()["runner"])
    assert runners and before not in runners


def test_replicas_starting_at_once_insert_the_defaults_once(db_url: str) -> None:
    from turnout.dashboard.app import prepare
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings
    from turnout.dashboard.store import canaries

    first = Services.build(Settings(database_url=db_url, demo=False))
    first.db.upgrade()
    second = Services.build(Settings(database_url=db_url, demo=False))
    errors: list[BaseException] = []
    with first.db.write_session() as s:
        # Replica one is half-way through its start-up: defaults inserted, not committed.
        first.db.lock_startup(s)
        canaries.ensure_defaults(session=s, defaults=first.policy.cohort_defaults())
        s.flush()

        def start_second() -> None:
            try:
                prepare(second)
            except BaseException as exc:  # the IntegrityError of a duplicate insert
                errors.append(exc)

        racer = threading.Thread(target=start_second)
        racer.start()
        racer.join(1.0)  # it waits for replica one instead of inserting alongside it
        assert racer.is_alive()
        s.commit()
    racer.join(30)
    assert errors == []
    with second.db.read_session() as s:
        rows = canaries.list_canaries(session=s)
    assert sorted(c.cohort for c in rows) == sorted(c.id for c in load_pack("turnout").cohorts)
    first.db.dispose()
    second.db.dispose()
