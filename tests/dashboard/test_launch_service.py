"""``turnout launch`` with a real local service (``turnout serve``): the stage's canary as the
service has it decides, the decision event reaches the service before vLLM runs (or stays
spooled when the service is down, and the next client sends it), the service down or hanging
leaves the last-known-good snapshot to decide, and ``--report-startup`` reports vLLM's
start-up line as a follow-up event, which the service keeps with the decision (one decision,
not two). vLLM is the fake of tests/fake_vllm.py, exec'ed for real."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_service import canaries, serving
from fake_vllm import child_output, dry_run, launch_env, make_fake_vllm, run_launch
from service_helpers import LiveService, free_port, make_tokens, start_service

# A deadline for the service that no loaded machine reaches: what these launches check (the
# service's snapshot decides, the event arrives before vLLM starts) must not depend on how busy
# the host is. The hung service's launch keeps the default deadline (QWEN3_DEFAULT).
QWEN3_DEFAULT = ["--", "vllm", "serve", "Qwen/Qwen3-8B"]
QWEN3 = ["--service-timeout", "30", *QWEN3_DEFAULT]
LLAMA = ["--service-timeout", "30", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
RUNNER = "VLLM_USE_V2_MODEL_RUNNER"


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveService, dict[str, str]]]:
    where = tmp_path_factory.mktemp("svc")
    url = f"sqlite:///{where / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, where / "svc.log")
    yield svc, tokens
    svc.stop()


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fake_vllm(tmp_path_factory.mktemp("venv") / "venv")


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _set_stage(
    svc: LiveService, tokens: dict[str, str], enabled: bool, stage: str = "qwen3-canary"
) -> None:
    url = f"{svc.url}/api/v1/canaries/{stage}"
    version = httpx.get(url, headers=_h(tokens["viewer"])).headers["ETag"].strip('"')
    r = httpx.patch(
        url,
        headers={**_h(tokens["operator"]), "If-Match": version},
        json={"enabled": enabled, "reason": "launch test"},
    )
    r.raise_for_status()


def _events(svc: LiveService, tokens: dict[str, str], deployment: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{svc.url}/api/v1/decisions",
        params={"deployment_id": deployment},
        headers=_h(tokens["viewer"]),
    )
    r.raise_for_status()
    return list(r.json())


def _env(fake: Path, cache: Path, url: str, token: str, deployment: str) -> dict[str, str]:
    return launch_env(
        fake, cache, TURNOUT_URL=url, TURNOUT_TOKEN=token, TURNOUT_DEPLOYMENT_ID=deployment
    )


def test_the_services_stage_decides_and_the_event_arrives_before_vllm(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    env = _env(fake, tmp_path / "c", svc.url, tokens["operator"], "prod/qwen3-a")
    _set_stage(svc, tokens, False)
    try:
        off = run_launch(QWEN3, env)
        assert off.returncode == 0, off.stderr
        assert child_output(off.stdout)["env"] == {**env, RUNNER: "0"}
        assert "canaries: the service's canary snapshot" in off.stderr
        assert "reported" in off.stderr and "spooled" not in off.stderr
        [event] = _events(svc, tokens, "prod/qwen3-a")  # stored before vLLM started
        assert (
            event["runner"],
            event["reason_code"],
            event["stage"],
            event["pack"],
            event["mode"],
        ) == ("v1", "DISABLED", "qwen3-canary", "turnout", "auto")
        assert event["rule_ids"] == ["rollout.stage_off"]
        # The launch part is kept with the decision (exec mode reports no start-up line).
        assert event["launch"] == {
            "vllm_version": "0.31.0",
            "vllm_pack": "vllm-0.31",
            "has_pack": True,
            "env": {RUNNER: "0"},
            "operator_pin": None,
            "snapshot_source": "service",
            "startup": None,
        }
    finally:
        _set_stage(svc, tokens, True)
    on = run_launch(QWEN3, env)
    assert on.returncode == 0, on.stderr
    assert child_output(on.stdout)["env"] == env  # unset: vLLM picks V2 by itself
    latest = _events(svc, tokens, "prod/qwen3-a")[0]
    assert (latest["runner"], latest["reason_code"]) == ("v2", "TARGETING_MATCH")


def test_an_operator_pin_is_reported_as_pinned(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    env = {**_env(fake, tmp_path / "c", svc.url, tokens["operator"], "prod/pinned"), RUNNER: "0"}
    done = run_launch(QWEN3, env)
    assert done.returncode == 0, done.stderr
    assert child_output(done.stdout)["env"] == env
    [event] = _events(svc, tokens, "prod/pinned")
    assert (event["runner"], event["mode"], event["reason_code"], event["rule_ids"]) == (
        "v1",
        "pinned",
        "STATIC",
        ["pin.v1"],
    )


def test_service_down_decides_from_the_last_known_good_copy_and_keeps_the_event(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    cache = tmp_path / "c"
    _set_stage(svc, tokens, False)
    try:  # one launch with the service up leaves its snapshot on disk
        up = dry_run(QWEN3, _env(fake, cache, svc.url, tokens["operator"], "prod/down"))
        assert up["snapshot_source"] == "service" and up["env"] == {RUNNER: "0"}
    finally:
        _set_stage(svc, tokens, True)
    dead = _env(fake, cache, f"http://127.0.0.1:{free_port()}", tokens["operator"], "prod/down")
    plan = dry_run(QWEN3, dead)
    assert (plan["snapshot_source"], plan["runner"], plan["env"]) == ("disk", "v1", {RUNNER: "0"})
    done = run_launch(QWEN3, dead)
    assert done.returncode == 0, done.stderr
    assert child_output(done.stdout)["env"][RUNNER] == "0"  # type: ignore[index]
    assert "spooled in" in done.stderr and _events(svc, tokens, "prod/down") == []
    # The next launch with the service up sends the spooled event too (and decides anew).
    again = run_launch(QWEN3, _env(fake, cache, svc.url, tokens["operator"], "prod/down"))
    assert again.returncode == 0, again.stderr
    events = _events(svc, tokens, "prod/down")
    assert [e["runner"] for e in events] == ["v2", "v1"]  # newest first


def test_a_service_that_never_answers_leaves_the_disk_copy_to_decide(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    cache = tmp_path / "c"
    dry_run(QWEN3, _env(fake, cache, svc.url, tokens["viewer"], "prod/hang"))  # a copy on disk
    with socket.socket() as sock:  # accepts connections, never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        hung = _env(
            fake, cache, f"http://127.0.0.1:{sock.getsockname()[1]}", tokens["viewer"], "prod/hang"
        )
        plan = dry_run(QWEN3_DEFAULT, hung)
    # Decided once the fetch was cut at its deadline, from the copy the first launch kept.
    assert (plan["snapshot_source"], plan["runner"]) == ("disk", "v2")


def test_report_startup_reports_vllms_line_and_the_service_keeps_it_with_the_decision(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    env = {
        **_env(fake, tmp_path / "c", svc.url, tokens["operator"], "prod/startup"),
        "FAKE_VLLM_MODE": "startup",
    }
    done = run_launch(["--report-startup", *QWEN3], env)
    assert done.returncode == 0, done.stderr
    assert "Using V2 Model Runner" in done.stdout
    assert "vLLM says it uses V2 (as decided)" in done.stderr
    # One decision: vLLM's line is kept with it, not counted as a second one.
    [event] = _events(svc, tokens, "prod/startup")
    startup = event["launch"]["startup"]
    assert (event["runner"], startup["runner"], startup["agrees"]) == ("v2", "v2", True)
    assert "Using V2 Model Runner" in startup["line"]
    assert startup["event_id"] == event["event_id"] + ".startup"


def test_report_startup_registers_vllm_at_its_advertised_address_until_it_exits(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    env = {
        **_env(fake, tmp_path / "c", svc.url, tokens["engine"], "prod/advertised"),
        "FAKE_VLLM_MODE": "startup",
        "FAKE_VLLM_HOLD_S": "60",
    }
    cmd = [sys.executable, "-m", "turnout.oracle.cli", "launch", "--report-startup",
           "--advertise-address", "vllm-7.pods.internal:8123", *QWEN3]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}

    def listed() -> list[dict[str, object]]:
        got = httpx.get(f"{svc.url}/api/v1/engines", headers=viewer).json()["engines"]
        return [e for e in got if e["deployment_id"] == "prod/advertised"]

    try:
        deadline = time.monotonic() + 60
        while not listed() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        [engine] = listed()
        assert (engine["address"], engine["engine"], engine["runner"], engine["vllm_version"]) == (
            "vllm-7.pods.internal:8123",
            "vllm",
            "v2",
            "0.31.0",
        )
    finally:
        proc.terminate()  # launch passes SIGTERM to vLLM, which exits; then it says goodbye
        _out, err = proc.communicate(timeout=60)
    assert "registered vLLM with the service" in err, err
    assert listed() == [], err


def test_a_refused_pin_is_reported_and_vllm_not_started(
    service: tuple[LiveService, dict[str, str]], fake: Path, tmp_path: Path
) -> None:
    svc, tokens = service
    env = {**_env(fake, tmp_path / "c", svc.url, tokens["operator"], "prod/refused"), RUNNER: "1"}
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
    done = run_launch([*QWEN3, "--speculative-config", spec], env)
    assert done.returncode == 3 and done.stdout == ""
    [event] = _events(svc, tokens, "prod/refused")
    assert (event["runner"], event["reason_code"], event["mode"]) == (None, "ERROR", "pinned")


def test_a_service_slower_than_50_ms_but_within_the_deadline_decides(
    fake: Path, tmp_path: Path
) -> None:
    """A snapshot that takes about 0.3 s to come (dripped a byte at a time) is waited for: the
    launch waits for its first fetch to end, not for a fixed 50 ms (which left the pack's
    defaults to decide here, with the Llama stage off)."""
    with serving() as slow:
        slow.canaries = (200, json.dumps(canaries(True)).encode())  # the Llama stage on
        slow.drip_s, slow.drip_bytes = 0.03, 10
        plan = dry_run(LLAMA, _env(fake, tmp_path / "c", slow.url, "tok", "prod/slow"))
    assert (plan["snapshot_source"], plan["runner"], plan["env"]) == ("service", "v2", {})
