"""``oracle.client`` against a real service: ETag snapshot fetch, last-known-good on disk,
decisions with the service down, the spool that survives a killed engine, batched reports.

(The client lives in the oracle package but needs a service to talk to, so its tests live with
the service's.)"""

from __future__ import annotations

import datetime as dt
import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import httpx
import pytest
from service_helpers import LiveService, free_port, make_tokens, start_service

from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.client import OracleClient, snapshot_from_json
from turnout.oracle.wire import decision_event

QWEN3 = from_spec({"architecture": "Qwen3ForCausalLM"})


@pytest.fixture
def service(tmp_path: Path, live: list[LiveService]) -> tuple[LiveService, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log")
    live.append(svc)
    return svc, tokens


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _flip_first_cohort(svc: LiveService, tokens: dict[str, str]) -> str:
    body = httpx.get(f"{svc.url}/api/v1/canaries", headers=_h(tokens["viewer"])).json()
    stage = decide(QWEN3, pack=load_pack("turnout")).stage
    cohort = next(c for c in body["cohorts"] if c["cohort"] == stage)
    r = httpx.patch(
        f"{svc.url}/api/v1/canaries/{stage}",
        headers={**_h(tokens["operator"]), "If-Match": str(cohort["version"])},
        json={"enabled": not cohort["enabled"], "reason": "client test"},
    )
    r.raise_for_status()
    return str(stage)


def test_decides_with_the_service_snapshot_and_reports(service: tuple, tmp_path: Path) -> None:
    svc, tokens = service
    _flip_first_cohort(svc, tokens)  # differ from the pack defaults
    served = httpx.get(f"{svc.url}/api/v1/canaries", headers=_h(tokens["viewer"])).json()
    # Not started: no background thread, so fetching and sending happen exactly when asked.
    client = OracleClient(svc.url, tokens["operator"], cache_dir=tmp_path / "c", host="gpu-7")
    assert client.refresh() == "service"
    decision = client.decide(QWEN3, deployment_id="prod/qwen3-8b")
    assert client.spool.pending() == 1
    assert client.flush() == 1 and client.spool.pending() == 0
    client.close()
    want = decide(QWEN3, pack=load_pack("turnout"), canaries=snapshot_from_json(served))
    assert decision.to_json() == want.to_json()
    assert decision.to_json() != decide(QWEN3, pack=load_pack("turnout")).to_json()
    rows = httpx.get(
        f"{svc.url}/api/v1/decisions?deployment_id=prod/qwen3-8b", headers=_h(tokens["viewer"])
    ).json()
    assert len(rows) == 1
    row = rows[0]
    assert (row["host"], row["runner"], row["reason_code"], row["family"], row["stage"]) == (
        "gpu-7",
        want.runner,
        want.reason_code,
        want.family,
        want.stage,
    )
    assert row["rule_ids"] == [r.rule_id for r in want.reasons]
    lkg = json.loads((tmp_path / "c" / "snapshot-turnout.json").read_text())
    # The copy holds what the client reads of the service's body, re-serialised (the label
    # and position of each stage are the pages', not the engine's).
    read = ("cohort", "enabled", "percentage", "version", "updated_at", "updated_by")
    assert [{k: c[k] for k in read} for c in served["cohorts"]] == [
        {**c, "updated_at": c["updated_at"].replace("+00:00", "Z")} for c in lkg["body"]["cohorts"]
    ]


def test_refresh_is_conditional_on_the_etag(service: tuple, tmp_path: Path) -> None:
    svc, tokens = service
    seen: list[int] = []
    hooks = {"response": [lambda r: seen.append(r.status_code)]}
    client = OracleClient(svc.url, tokens["viewer"], cache_dir=tmp_path / "c")
    client._http.event_hooks = hooks  # type: ignore[union-attr]
    assert client.refresh() == "service" and client.refresh() == "service"
    _flip_first_cohort(svc, tokens)
    client.refresh()
    client.close()
    assert seen == [200, 304, 200]


def test_service_down_decides_from_disk_and_keeps_events(service: tuple, tmp_path: Path) -> None:
    svc, tokens = service
    stage = _flip_first_cohort(svc, tokens)
    cache = tmp_path / "c"
    with OracleClient(svc.url, tokens["operator"], cache_dir=cache, startup_wait_s=5.0) as c:
        online = c.decide(QWEN3, report=False)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with OracleClient(dead, tokens["operator"], cache_dir=cache) as client:
        offline = client.decide(QWEN3, deployment_id="offline/1")
        assert client.snapshot_source == "disk"
        assert client.flush() == 0 and client.spool.pending() == 1
    assert client.spool.pending() == 1  # still on disk after the last try at close
    assert offline.to_json() == online.to_json()
    assert offline.stage == stage
    # Next start, service reachable: the spooled event is delivered once.
    client = OracleClient(svc.url, tokens["operator"], cache_dir=cache)
    assert client.flush() == 1 and client.spool.pending() == 0
    client.close()
    rows = httpx.get(
        f"{svc.url}/api/v1/decisions?deployment_id=offline/1", headers=_h(tokens["viewer"])
    ).json()
    assert len(rows) == 1


def test_no_service_no_disk_copy_uses_pack_defaults(tmp_path: Path) -> None:
    # A listener that accepts and never answers: the fetch can only time out.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        client = OracleClient(
            url, "tok_x", cache_dir=tmp_path / "c", timeout_s=2.0, startup_wait_s=0.05
        ).start()
        decision = client.decide(QWEN3, report=False)
        source = client.snapshot_source
    client.close()
    assert source == "defaults"
    assert decision.to_json() == decide(QWEN3, pack=load_pack("turnout")).to_json()


def test_decide_never_raises_for_an_event_it_cannot_build(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment id longer than an event takes (256 characters): the decision is returned
    and the unreported event logged. decide() raised pydantic's ValidationError before (an
    engine with a long TURNOUT_DEPLOYMENT_ID did not start)."""
    client = OracleClient("http://127.0.0.1:9", "tok_x", cache_dir=tmp_path / "c")
    with caplog.at_level("ERROR", logger="turnout.client"):
        decision = client.decide(QWEN3, deployment_id="d" * 300)
    client.close(flush_timeout_s=0)
    assert decision.runner == decide(QWEN3, pack=load_pack("turnout")).runner
    assert "not reported" in caplog.text and "deployment_id" in caplog.text
    assert client.spool.pending() == 0


ENGINE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from turnout.oracle import from_spec
    from turnout.oracle.client import OracleClient
    client = OracleClient(sys.argv[1], "tok_x", cache_dir=Path(sys.argv[2]))
    config = from_spec({"architecture": "Qwen3ForCausalLM"})
    for i in range(25):
        client.decide(config, deployment_id=f"crashed/{i}")
    print("reported", flush=True)
    time.sleep(60)
""")


def test_events_of_a_killed_engine_are_sent_by_the_next_client(
    service: tuple, tmp_path: Path
) -> None:
    svc, tokens = service
    cache = tmp_path / "c"
    dead = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE, dead, str(cache)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "reported"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    client = OracleClient(svc.url, tokens["operator"], cache_dir=cache, batch_size=10)
    assert client.flush() == 25 and client.spool.pending() == 0
    client.close()
    fb = httpx.get(f"{svc.url}/api/v1/fallbacks", headers=_h(tokens["viewer"])).json()
    assert fb["num_deployments"] == 25


def test_a_rejected_batch_is_set_aside_and_does_not_block_the_rest(
    service: tuple, tmp_path: Path
) -> None:
    svc, tokens = service
    cache = tmp_path / "c"
    client = OracleClient(svc.url, tokens["operator"], cache_dir=cache)
    client.spool.append({"event_id": "bad one", "at": "not a time"})
    assert client.flush() == 0
    assert len(list((cache / "spool").glob("rejected-*.jsonl"))) == 1
    client.decide(QWEN3, deployment_id="after-bad")
    assert client.flush() == 1
    client.close()


def test_background_thread_reports_without_flush(service: tuple, tmp_path: Path) -> None:
    svc, tokens = service
    done = threading.Event()
    with OracleClient(
        svc.url, tokens["operator"], cache_dir=tmp_path / "c", flush_interval_s=0.05
    ) as client:
        client.decide(QWEN3, deployment_id="bg/1")
        for _ in range(200):
            if client.spool.pending() == 0:
                done.set()
                break
            threading.Event().wait(0.05)
    assert done.is_set()


def test_without_a_service_url_it_decides_with_pack_defaults_and_spools_nothing(
    tmp_path: Path,
) -> None:
    with OracleClient(None, cache_dir=tmp_path / "c") as client:
        decision = client.decide(QWEN3, deployment_id="standalone")
        assert client.snapshot_source == "defaults" and client.spool.pending() == 0
    assert decision.to_json() == decide(QWEN3, pack=load_pack("turnout")).to_json()


def test_a_refused_token_is_said_once_with_the_services_reason(
    service: tuple, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import datetime as dt

    svc, tokens = service
    client = OracleClient(svc.url, tokens["viewer"], cache_dir=tmp_path / "c")  # reads only
    client.decide(QWEN3, deployment_id="prod/viewer")
    end = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    client.report_health(
        {
            "deployment_id": "prod/viewer",
            "runner": "v1",
            "family": "qwen3",
            "window_start": end - dt.timedelta(minutes=1),
            "window_end": end,
            "num_requests": 1,
            "num_errors": 0,
        }
    )
    with caplog.at_level("WARNING", logger="turnout.client"):
        assert client.flush() == 0 and client.flush() == 0
    client.close()
    said = [r.getMessage() for r in caplog.records if "deferred" in r.getMessage()]
    reason = "(HTTP 403: this needs the engine role; the token has viewer)"
    assert said == [
        f"decision report deferred {reason}: 1 spooled, kept until the service takes the token",
        f"health report deferred {reason}: 1 spooled, kept until the service takes the token",
    ], said
    assert client.spool.pending() == 1 and client.health.spool.pending() == 1


def test_an_event_dated_ahead_waits_until_the_clocks_agree(
    tmp_path: Path, live: list[LiveService]
) -> None:
    # Before: an event the service refused as event_in_future was set aside for good, and
    # stayed aside after the engine host's clock was fixed.
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log", env={"TURNOUT_MAX_CLOCK_SKEW_S": "1"})
    live.append(svc)
    cache = tmp_path / "c"
    client = OracleClient(svc.url, tokens["operator"], cache_dir=cache)
    now = dt.datetime.now(dt.UTC)
    decision = decide(QWEN3, pack=load_pack("turnout"))

    def event(deployment: str, at: dt.datetime) -> dict:
        return decision_event(
            decision, QWEN3, pack="turnout", deployment_id=deployment, at=at
        ).to_json()

    client.spool.append(event("on-time", now))
    client.spool.append(event("ahead", now + dt.timedelta(minutes=10)))
    client.spool.append(event("year-2100", now.replace(year=2100)))
    assert client.flush() == 1  # on-time stored; ahead kept; 2100 set aside (no fix helps)
    assert client.spool.pending() == 1
    [aside] = (cache / "spool").glob("rejected-*.jsonl")
    assert "year-2100" in aside.read_text() and "ahead" not in aside.read_text()
    assert client.flush() == 0 and client.spool.pending() == 1  # not due again yet: kept
    client.close()
    # the deferred segment is due a minute later: now, for the test
    for seg in (cache / "spool").glob("sealed-*-deferred-*.jsonl"):
        seg.rename(seg.with_name(seg.name.rsplit("-deferred-", 1)[0] + "-deferred-0.jsonl"))
    # the clocks agree (here: the service allows the skew; the same as fixing the host)
    svc.stop()
    port = int(svc.url.rsplit(":", 1)[1])
    svc = start_service(
        url, tmp_path / "svc.log", env={"TURNOUT_MAX_CLOCK_SKEW_S": "3600"}, port=port
    )
    live.append(svc)
    client = OracleClient(svc.url, tokens["operator"], cache_dir=cache)
    assert client.flush() == 1 and client.spool.pending() == 0
    client.close()
    stored = httpx.get(
        f"{svc.url}/api/v1/decisions?deployment_id=ahead", headers=_h(tokens["viewer"])
    ).json()
    assert [e["deployment_id"] for e in stored] == ["ahead"]
