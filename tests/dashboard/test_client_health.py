"""``oracle.client`` reporting runtime health: spooled before it returns, sent in batches,
acknowledged only by the service's answer for the batch, a refused report set aside alone;
watched sources asked periodically and once more at the end. Against a real service and a
real misbehaving one (tests/dashboard/fake_service.py)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_service import FakeService, serving, wait_for
from service_helpers import LiveService, make_tokens, start_service

from turnout.oracle.client import OracleClient

STAGE = "llama-mistral-dense"


def fields(**over: Any) -> dict[str, Any]:
    end = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    return {
        "deployment_id": "prod/llama-8b",
        "runner": "v2",
        "family": "llama",
        "stage": STAGE,
        "window_start": end - dt.timedelta(minutes=1),
        "window_end": end,
        "num_requests": 20,
        "num_errors": 1,
        "num_crashes": 0,
        "ttft_p50_ms": 30.0,
        "ttft_p99_ms": 90.0,
        "tpot_p50_ms": 6.0,
        "tpot_p99_ms": 11.0,
        "num_output_tokens": 2000,
        "output_tokens_per_s": 250.0,
    } | over


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with serving() as server:
        yield server


@pytest.fixture
def service(tmp_path: Path, live: list[LiveService]) -> tuple[LiveService, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log")
    live.append(svc)
    return svc, tokens


def test_reports_reach_the_service_and_a_refused_one_is_set_aside_alone(
    service: tuple[LiveService, dict[str, str]], tmp_path: Path
) -> None:
    svc, tokens = service
    cache = tmp_path / "c"
    client = OracleClient(svc.url, tokens["operator"], cache_dir=cache, host="gpu-3")
    good = [client.report_health(fields(runner=r)) for r in ("v1", "v2", "v2")]
    bad = client.report_health(fields(stage="llama-dense"))  # valid shape, not the pack's
    assert client.health.spool.pending() == 4
    assert client.flush() == 3 and client.health.spool.pending() == 0
    (aside,) = (cache / "spool-health").glob("rejected-*.jsonl")
    assert [json.loads(x)["report_id"] for x in aside.read_text().splitlines()] == [bad]
    client.close()
    body = httpx.get(
        f"{svc.url}/api/v1/health?stage={STAGE}",
        headers={"Authorization": f"Bearer {tokens['viewer']}"},
    ).json()
    assert {r: h["num_reports"] for r, h in body["by_runner"].items()} == {"v1": 1, "v2": 2}
    assert body["by_runner"]["v2"]["tpot_p99_ms"] == 11.0
    assert len(good) == 3


def test_a_200_that_is_not_the_acknowledgement_keeps_the_reports(
    fake: FakeService, tmp_path: Path
) -> None:
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    ids = [client.report_health(fields()) for _ in range(2)]
    fake.ingest_answer = (200, b"<html>Service Unavailable</html>", "text/html")
    assert client.flush() == 0 and client.health.spool.pending() == 2
    fake.ingest_answer = None
    assert client.flush() == 2 and sorted(fake.health) == sorted(ids)
    client.close()


def test_a_report_that_is_not_one_is_refused_before_the_spool(
    fake: FakeService, tmp_path: Path
) -> None:
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="num_errors cannot exceed num_requests"):
        client.report_health(fields(num_errors=21))
    assert client.health.spool.pending() == 0
    client.close()


def test_a_watched_source_reports_every_interval_and_once_more_at_close(
    fake: FakeService, tmp_path: Path
) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def source() -> dict[str, Any]:
        with lock:
            calls.append(len(calls))
            return fields(num_requests=len(calls))

    client = OracleClient(
        fake.url, "tok", cache_dir=tmp_path / "c", health_interval_s=0.05, flush_interval_s=0.02
    ).start()
    client.watch_health(source)
    assert wait_for(lambda: len(fake.health) >= 2)
    client.close()
    # The last call was made at close, and its report was sent before the client stopped.
    assert max(r["num_requests"] for r in fake.health.values()) == len(calls)
    assert all(r["host"] and r["pack"] == "turnout" for r in fake.health.values())


def test_unwatching_a_source_spools_its_last_report(fake: FakeService, tmp_path: Path) -> None:
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c", health_interval_s=3600)

    def first() -> dict[str, Any]:
        return fields(num_requests=7)

    client.watch_health(first)
    client.watch_health(lambda: fields(num_requests=8))
    client.unwatch_health(lambda: None)  # not watched: nothing happens
    assert client.health.spool.pending() == 0
    client.unwatch_health(first)
    assert client.health.spool.pending() == 1
    client.close()  # not started: the last reports are spooled, and left to the next client
    assert client.health.spool.pending() == 2
    nxt = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    assert nxt.flush() == 2
    assert sorted(r["num_requests"] for r in fake.health.values()) == [7, 8]
    nxt.close()


def test_without_a_service_nothing_is_spooled(tmp_path: Path) -> None:
    with OracleClient(None, cache_dir=tmp_path / "c") as client:
        assert client.report_health(fields()) is None
        client.watch_health(lambda: fields())
    assert client.health.spool.pending() == 0
