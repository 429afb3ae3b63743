"""``oracle.client`` keeps every report and trusts only the service: what passes for an
acknowledgement, who owns a spool segment, which snapshot may replace the last good one, and
how long one request may take. Each test is a fault found by trying to break the client,
against a real HTTP server on a local port (tests/dashboard/fake_service.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_service import LLAMA, PACK, FakeService, canaries, serving

from turnout.oracle import decide
from turnout.oracle.client import OracleClient
from turnout.oracle.wire import batch_digest


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with serving() as server:
        yield server


def _report(client: OracleClient, n: int) -> list[str]:
    return [client.report(decide(LLAMA, pack=PACK), LLAMA, deployment_id=f"d{i}") for i in range(n)]


# -- 1. an acknowledgement is the service's answer for this batch -----------------------------
@pytest.mark.parametrize(
    "answer",
    [
        (200, b"<html><body>Welcome to nginx!</body></html>", "text/html"),
        (200, b"", "application/json"),
        (200, b"{}", "application/json"),
        (200, b'{"accepted": 3}', "application/json"),  # no digest: whose batch?
        (
            200,
            json.dumps(
                {"accepted": 3, "inserted": 3, "batch_digest": batch_digest(["x"])}
            ).encode(),
            "application/json",
        ),  # another batch's answer
        (200, b'{"accepted": "3", "batch_digest": "x"}', "application/json"),
    ],
    ids=["html", "empty", "empty-object", "no-digest", "other-batch", "wrong-types"],
)
def test_a_200_that_is_not_the_services_acknowledgement_keeps_the_batch(
    fake: FakeService, tmp_path: Path, answer: tuple[int, bytes, str]
) -> None:
    # A 200 from whatever answered (a proxy's page) counted as delivered: the events were
    # deleted from the spool and never reached the store.
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    ids = _report(client, 3)
    fake.ingest_answer = answer
    assert client.flush() == 0
    assert client.spool.pending() == 3
    fake.ingest_answer = None  # the service itself answers again
    assert client.flush() == 3 and client.spool.pending() == 0
    assert sorted(fake.stored) == sorted(ids)
    client.close()


def test_an_acknowledgement_of_a_batch_with_a_count_off_by_one_keeps_it(
    fake: FakeService, tmp_path: Path
) -> None:
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    ids = _report(client, 2)
    fake.ingest_answer = (
        200,
        json.dumps({"accepted": 1, "inserted": 1, "batch_digest": batch_digest(ids)}).encode(),
        "application/json",
    )
    assert client.flush() == 0 and client.spool.pending() == 2
    client.close()


# -- 2. spool segments are owned by locks, not process ids --------------------------------
WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from turnout.oracle.client_spool import Spool
    spool = Spool(Path(sys.argv[1]))
    for i in range(int(sys.argv[2])):
        spool.append({"event_id": f"e{i}", "deployment_id": f"d{i}", "at": "2026-11-30T00:00:00Z"})
    print("written", flush=True)
    time.sleep(120)
""")


def _writer(directory: Path, n: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(n)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    return proc


def test_a_crashed_engines_segment_is_sent_by_a_restart_with_the_same_pid(
    fake: FakeService, tmp_path: Path
) -> None:
    # PID 1 in a container: the engine that crashed and the one that restarts have the same
    # process id, so a segment claimed by pid looked live to its own successor and was never
    # sent. Here the crashed run's segment carries this process's id, as it would there.
    spool_dir = tmp_path / "c" / "spool"
    proc = _writer(spool_dir, 4)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    (segment,) = spool_dir.glob("open-*.jsonl")
    segment.rename(spool_dir / f"open-{os.getpid()}-0badc0de.jsonl")
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    assert client.flush() == 4
    assert sorted(fake.stored) == ["e0", "e1", "e2", "e3"]
    assert client.spool.pending() == 0
    client.close()


def test_a_live_writers_segment_is_left_to_it_until_it_dies(
    fake: FakeService, tmp_path: Path
) -> None:
    spool_dir = tmp_path / "c" / "spool"
    proc = _writer(spool_dir, 3)
    try:
        client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
        assert client.flush() == 0  # locked: another engine is still writing it
        assert list(spool_dir.glob("open-*.jsonl")) and not fake.stored
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert client.flush() == 3 and sorted(fake.stored) == ["e0", "e1", "e2"]
    client.close()


def test_two_clients_on_one_directory_never_seal_each_others_open_segment(
    fake: FakeService, tmp_path: Path
) -> None:
    first = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    second = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    ids = _report(first, 2)
    assert second.flush() == 0  # first's segment is live (same process, another lock)
    ids += _report(first, 1)  # first goes on appending to it
    assert first.flush() == 3 and sorted(fake.stored) == sorted(ids)
    first.close()
    second.close()


# -- 3. only a snapshot of this engine's pack replaces the last good one ------------------
def _other_pack_cohorts() -> list[dict[str, object]]:
    body = canaries(True)
    return [dict(c, cohort=f"other-{i}") for i, c in enumerate(body["cohorts"])]


@pytest.mark.parametrize(
    "body",
    [
        canaries(True, cohorts=[]),
        canaries(True, cohorts=_other_pack_cohorts()),
        canaries(True, cohorts=canaries(False)["cohorts"][1:]),  # a stage missing
        canaries(True, cohorts=[*canaries(True)["cohorts"], canaries(False)["cohorts"][1]]),
        canaries(True, pack_digest="0123456789abcdef"),  # another revision of the pack
        canaries(True, pack="vllm-0.31"),
        canaries(True, pack=None),
        canaries(True, pack_digest=None),  # before: used, and a hostile one put all at 100 %
    ],
    ids=[
        "no-cohorts",
        "other-cohorts",
        "stage-missing",
        "cohort-twice",
        "other-revision",
        "other-pack",
        "no-pack",
        "no-digest",
    ],
)
def test_a_snapshot_of_another_pack_does_not_replace_the_last_good_one(
    fake: FakeService, tmp_path: Path, body: dict[str, object]
) -> None:
    # Any well-formed snapshot was used and written to disk: one with no cohorts turned every
    # stage to its default, at once and for every later start.
    cache = tmp_path / "c"
    fake.canaries = (200, json.dumps(canaries(False, engaged=True)).encode())
    client = OracleClient(fake.url, "tok", cache_dir=cache)
    assert client.refresh() == "service"
    held = client.decide(LLAMA, report=False)
    assert held.reason_code == "DISABLED"  # the kill switch
    kept = (cache / "snapshot-turnout.json").read_bytes()
    fake.canaries = (200, json.dumps(body).encode())
    client.refresh()
    assert client.decide(LLAMA, report=False) == held
    assert (cache / "snapshot-turnout.json").read_bytes() == kept
    client.close()
    # Nor is such a copy, found on disk, used by the next start.
    (cache / "snapshot-turnout.json").write_text(json.dumps({"etag": "x", "body": body}))
    with OracleClient(None, cache_dir=cache) as fresh:
        assert fresh.snapshot_source == "defaults"


def test_the_kill_switch_of_another_revision_of_the_pack_is_honoured_alone(
    fake: FakeService, tmp_path: Path
) -> None:
    # While the service runs another revision of the pack than the engine (a pack upgrade in
    # progress), its snapshot is not used, but its engaged kill switch must still reach the
    # engine: ignoring it would keep V2 running where an operator stopped it.
    cache = tmp_path / "c"
    fake.canaries = (200, json.dumps(canaries(True)).encode())
    client = OracleClient(fake.url, "tok", cache_dir=cache)
    assert client.refresh() == "service"
    assert client.decide(LLAMA, report=False).runner == "v2"
    kept = (cache / "snapshot-turnout.json").read_bytes()
    foreign = canaries(True, engaged=True, pack_digest="0123456789abcdef", cohorts=[])
    fake.canaries = (200, json.dumps(foreign).encode())
    client.refresh()
    killed = client.decide(LLAMA, report=False)
    assert killed.runner == "v1" and killed.reason_code == "DISABLED"
    assert (cache / "snapshot-turnout.json").read_bytes() == kept  # never saved
    # Released on the service: the engine's own copy decides again.
    fake.canaries = (
        200,
        json.dumps(dict(foreign, kill_switch=dict(foreign["kill_switch"], engaged=False))).encode(),
    )
    client.refresh()
    assert client.decide(LLAMA, report=False).runner == "v2"
    # Another pack's engaged switch is not this pack's.
    fake.canaries = (200, json.dumps(canaries(True, engaged=True, pack="vllm-0.31")).encode())
    client.refresh()
    assert client.decide(LLAMA, report=False).runner == "v2"
    client.close()


def test_a_snapshot_of_this_pack_with_stages_the_pack_no_longer_has_is_used(
    fake: FakeService, tmp_path: Path
) -> None:
    body = canaries(True)
    body["cohorts"].append(dict(body["cohorts"][0], cohort="retired-stage"))
    fake.canaries = (200, json.dumps(body).encode())
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    assert client.refresh() == "service"
    assert client.decide(LLAMA, report=False).runner == "v2"
    client.close()


# -- 4. the timeout bounds the request, not each read --------------------------------------
def test_a_snapshot_dripped_a_byte_at_a_time_is_cut_at_the_deadline(
    fake: FakeService, tmp_path: Path
) -> None:
    # 80 bytes, one every 0.3 s: no read waits 0.5 s, so the read timeout never fired and a
    # refresh took 24 s (the start-up decision waits for the first one).
    fake.drip_s = 0.3
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c", timeout_s=0.5)
    assert client.refresh() == "defaults"
    assert fake.answered.acquire(timeout=60)
    assert fake.cut_off == 1  # the client hung up before the answer was complete
    client.close()


def test_an_acknowledgement_dripped_a_byte_at_a_time_is_cut_and_the_batch_kept(
    fake: FakeService, tmp_path: Path
) -> None:
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c", timeout_s=0.5)
    ids = _report(client, 2)
    fake.drip_s = 0.3
    assert client.flush() == 0
    assert fake.answered.acquire(timeout=60) and fake.cut_off == 1
    assert client.spool.pending() == 2
    fake.drip_s = None
    assert client.flush() == 2 and sorted(fake.stored) == sorted(ids)
    client.close()


def _nested(depth: int) -> str:
    """JSON text of objects nested ``depth`` deep (as text: json.dumps would recurse)."""
    return '{"x": ' * depth + "1" + "}" * depth


def test_a_snapshot_is_kept_on_disk_as_the_client_read_it(
    fake: FakeService, tmp_path: Path
) -> None:
    # Before: the body was kept verbatim. An extra field nested 985 levels deep passed the
    # checks, was saved, and every later start failed with a RecursionError. Now a body
    # nested deeper than bounded_json.MAX_DEPTH is no snapshot, and what is kept of one that
    # is holds only the fields the client reads.
    cache = tmp_path / "c"
    client = OracleClient(fake.url, "tok", cache_dir=cache)
    plain = json.dumps(canaries(False))[:-1]
    fake.canaries = (200, (plain + ', "extra": ' + _nested(985) + "}").encode())
    assert client.refresh() == "defaults"
    assert not (cache / "snapshot-turnout.json").exists()
    fake.canaries = (200, (plain + ', "extra": ' + _nested(30) + "}").encode())
    assert client.refresh() == "service"
    held = client.decide(LLAMA, report=False)
    assert held.reason_code == "DISABLED"
    client.close()
    kept = json.loads((cache / "snapshot-turnout.json").read_text())
    assert set(kept["body"]) == {"pack", "pack_digest", "kill_switch", "cohorts"}
    with OracleClient(None, cache_dir=cache) as fresh:
        assert fresh.snapshot_source == "disk"
        assert fresh.decide(LLAMA, report=False) == held


@pytest.mark.parametrize(
    "content",
    [
        ('{"etag": null, "body": ' + _nested(985) + "}").encode(),
        b"[" * 50_000,
        b"\xff\xfe",
        b'{"etag": 1}',
    ],
    ids=["deep", "deeper-than-the-stack", "not-utf8", "no-body"],
)
def test_a_copy_on_disk_that_cannot_be_read_is_moved_aside(tmp_path: Path, content: bytes) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "snapshot-turnout.json").write_bytes(content)
    with OracleClient(None, cache_dir=cache) as fresh:
        assert fresh.snapshot_source == "defaults"
        assert fresh.decide(LLAMA, report=False) == decide(LLAMA, pack=PACK)
    assert not (cache / "snapshot-turnout.json").exists()
    [aside] = cache.glob("snapshot-turnout.json.bad-*")
    assert aside.read_bytes() == content  # kept for a person


def test_a_304_to_a_fetch_that_was_not_conditional_is_no_snapshot(
    fake: FakeService, tmp_path: Path
) -> None:
    # Before: "not modified" with nothing to compare against was reported as the service's.
    fake.canaries = (304, b"")
    client = OracleClient(fake.url, "tok", cache_dir=tmp_path / "c")
    assert client.refresh() == "defaults"
    assert client.decide(LLAMA, report=False) == decide(LLAMA, pack=PACK)
    fake.canaries = (200, json.dumps(canaries(True)).encode())
    assert client.refresh() == "service"
    fake.canaries = (304, b"")  # now conditional (the ETag was sent): the copy stands
    assert client.refresh() == "service"
    client.close()
