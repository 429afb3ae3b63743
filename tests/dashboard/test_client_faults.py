"""``oracle.client`` against a service that misbehaves (garbage bodies, 500s, wrong types),
and against corrupt files of its own (last-known-good copy, spool): the engine still decides,
the background thread lives on, and no event the service could take is lost.

The misbehaving service is a real HTTP server on a local port whose answers the test sets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_service import LLAMA, PACK, STAGE, FakeService, canaries, serving, wait_for

from turnout.oracle import CanarySnapshot, CohortState, decide
from turnout.oracle.client import OracleClient

_canaries = canaries
_wait = wait_for


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with serving() as server:
        yield server


@pytest.mark.parametrize(
    "body",
    [
        b"<html>502 Bad Gateway</html>",
        b"[1, 2]",
        b'{"pack": "turnout"}',
        json.dumps(_canaries("false")).encode(),
        json.dumps(_canaries(True, engaged="no")).encode(),
        b"\xff\xfe",
    ],
)
def test_garbage_snapshot_keeps_the_last_good_one(
    fake: FakeService, tmp_path: Path, body: bytes
) -> None:
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    assert client.refresh() == "service"
    on = client.decide(LLAMA, report=False)
    assert on.runner == "v2"  # the service enabled the Llama stage
    fake.canaries = (200, body)
    assert client.refresh() == "service"  # kept, not replaced by garbage
    assert client.decide(LLAMA, report=False) == on
    client.close()
    # A fresh engine that only ever saw garbage decides with the pack's defaults.
    other = OracleClient(fake.url, "tok", cache_dir=tmp_path / "other")
    assert other.refresh() == "defaults"
    assert other.decide(LLAMA, report=False) == decide(LLAMA, pack=PACK)
    other.close()


def test_background_thread_survives_garbage_and_500s(fake: FakeService, tmp_path: Path) -> None:
    fake.canaries = (200, b"not json")
    fake.ingest_status = 500
    with OracleClient(
        fake.url,
        "tok",
        cache_dir=tmp_path / "c",
        flush_interval_s=0.02,
        refresh_interval_s=0.05,
        startup_wait_s=5.0,
    ) as client:
        first = client.decide(LLAMA, deployment_id="during-outage")
        assert first == decide(LLAMA, pack=PACK)
        time.sleep(0.3)  # several failed refreshes and sends
        assert client.spool.pending() == 1
        fake.canaries = (200, json.dumps(_canaries(True)).encode())
        fake.ingest_status = None
        assert _wait(lambda: client.decide(LLAMA, report=False).runner == "v2")
        assert _wait(lambda: client.spool.pending() == 0)
    assert [e["deployment_id"] for e in fake.stored.values()] == ["during-outage"]


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00",
        b'{"etag": "x", "body": ',
        json.dumps({"etag": "x", "body": _canaries("false")}).encode(),
        json.dumps({"etag": "x", "body": [1]}).encode(),
        json.dumps([1, 2]).encode(),
    ],
)
def test_corrupt_last_known_good_falls_back_to_the_defaults(tmp_path: Path, content: bytes) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "snapshot-turnout.json").write_bytes(content)
    with OracleClient(None, cache_dir=cache) as client:
        assert client.snapshot_source == "defaults"
        assert client.decide(LLAMA) == decide(LLAMA, pack=PACK)


def test_last_known_good_with_string_booleans_is_not_read_as_true(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    body = _canaries(False, engaged="false")
    (cache / "snapshot-turnout.json").write_text(json.dumps({"etag": "x", "body": body}))
    with OracleClient(None, cache_dir=cache) as client:
        assert client.snapshot_source == "defaults"  # refused, not a kill switch engaged
    body["kill_switch"]["engaged"] = False
    (cache / "snapshot-turnout.json").write_text(json.dumps({"etag": "x", "body": body}))
    with OracleClient(None, cache_dir=cache) as client:
        assert client.snapshot_source == "disk"
        want = CanarySnapshot({STAGE: CohortState(False, 100)})  # type: ignore[dict-item]
        assert client.decide(LLAMA) == decide(LLAMA, pack=PACK, canaries=want)


def test_corrupt_spool_lines_are_set_aside_and_the_rest_delivered(
    fake: FakeService, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    client = OracleClient(fake.url, "tok", cache_dir=cache)
    ids = [client.report(decide(LLAMA, pack=PACK), LLAMA, deployment_id=f"d{i}") for i in range(3)]
    client.spool._seal_own()
    (segment,) = (cache / "spool").glob("sealed-*.jsonl")
    lines = segment.read_bytes().split(b"\n")
    # Corruption in the middle: bytes that are not UTF-8, a line that is not JSON, a JSON
    # value that is not an event; and a torn last line (a crash inside append).
    segment.write_bytes(
        b"\n".join([lines[0], b"\xff\xfe{", lines[1], b"{nope", b"[1]", lines[2], b""])
        + b'{"event_id": "torn'
    )
    assert client.spool.pending() == 3
    assert client.flush() == 3
    assert sorted(fake.stored) == sorted(ids)
    (aside,) = (cache / "spool").glob("rejected-*.jsonl")
    assert aside.read_text().splitlines() == ["\ufffd\ufffd{", "{nope", "[1]"]
    assert client.spool.pending() == 0
    client.close()


def test_one_bad_event_in_a_batch_does_not_set_the_others_aside(
    fake: FakeService, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    client = OracleClient(fake.url, "tok", cache_dir=cache, batch_size=3)
    good = [client.report(decide(LLAMA, pack=PACK), LLAMA, deployment_id=f"d{i}") for i in range(2)]
    client.spool.append({"event_id": "bad-one", "at": "x", "deployment_id": 7})
    good += [
        client.report(decide(LLAMA, pack=PACK), LLAMA, deployment_id=f"d{i}") for i in range(2, 6)
    ]
    assert client.flush() == 6
    assert sorted(fake.stored) == sorted(good)
    (aside,) = (cache / "spool").glob("rejected-*.jsonl")
    assert [json.loads(x)["event_id"] for x in aside.read_text().splitlines()] == ["bad-one"]
    client.close()


def test_a_spool_that_cannot_be_written_does_not_stop_deciding(
    fake: FakeService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "c"
    client = OracleClient(fake.url, "tok", cache_dir=cache)
    spool = cache / "spool"
    spool.rmdir()
    spool.write_text("not a directory any more")  # as unwritable as a full disk
    with caplog.at_level("ERROR", logger="turnout.client"):
        decision = client.decide(LLAMA, deployment_id="d1")
    assert decision == decide(LLAMA, pack=PACK)
    assert "not reported: cannot write the spool" in caplog.text
    with pytest.raises(OSError):
        client.report(decision, LLAMA, deployment_id="d1")
    client.close()


def test_a_batch_the_service_finds_too_large_is_split_not_retried_forever(
    fake: FakeService, tmp_path: Path
) -> None:
    # A 413 was retried as an outage: a batch over the service's body bound blocked the spool
    # for good. It is split like a 422, down to the single events the service refuses.
    cache = tmp_path / "c"
    client = OracleClient(fake.url, "tok", cache_dir=cache, batch_size=4)
    ids = [client.report(decide(LLAMA, pack=PACK), LLAMA, deployment_id=f"d{i}") for i in range(4)]
    fake.ingest_status = 413
    assert client.flush() == 0
    assert client.spool.pending() == 0  # nothing left to retry
    (aside,) = (cache / "spool").glob("rejected-*.jsonl")
    assert [json.loads(x)["event_id"] for x in aside.read_text().splitlines()] == ids
    client.close()


@pytest.mark.parametrize(
    ("status", "body", "content_type"),
    [
        (413, b"<html><h1>413 Request Entity Too Large</h1>nginx</html>", "text/html"),
        (422, b"<html>Unprocessable</html>", "text/html"),
        (422, b'{"detail": "not the service"}', "application/json"),
        (422, b'{"detail": {"code": "made_up", "message": "x"}}', "application/json"),
        (413, b"", "text/plain"),
        (422, b"[" * 100_000, "application/json"),  # before: RecursionError out of flush()
    ],
    ids=[
        "proxy-413-html",
        "proxy-422-html",
        "422-detail-text",
        "422-unknown-code",
        "413-empty",
        "422-deep",
    ],
)
def test_a_refusal_that_is_not_the_services_sets_nothing_aside(
    fake: FakeService, tmp_path: Path, status: int, body: bytes, content_type: str
) -> None:
    # Before: any 413 or 422 split the batch down to single events and set every one aside
    # in rejected-*.jsonl for good (200 of 200 reports lost behind a proxy's 422 page).
    cache = tmp_path / "c"
    client = OracleClient(fake.url, "tok", cache_dir=cache, batch_size=4)
    ids = [client.report(decide(LLAMA, pack=PACK), LLAMA, deployment_id=f"d{i}") for i in range(6)]
    fake.ingest_answer = (status, body, content_type)
    assert client.flush() == 0
    assert client.spool.pending() == 6  # all kept for a resend
    assert not list((cache / "spool").glob("rejected-*.jsonl"))
    fake.ingest_answer = None  # the proxy is fixed: everything arrives
    assert client.flush() == 6
    assert sorted(fake.stored) == sorted(ids)
    assert not list((cache / "spool").glob("rejected-*.jsonl"))
    client.close()
