"""Where the server's engine core runs: the engine-core process (the default) and a thread of
the server's process (``TURNOUT_ENABLE_MULTIPROCESSING=0``), on real servers with the shipped
SmolLM2; and the loop itself (:class:`CoreLoop`) on a real engine core."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving_helpers import SMOLLM2, Server, spawn_server, start_server

from turnout.engine.outputs import Logprobs
from turnout.engine.sampling_params import SamplingParams
from turnout.serving.async_engine import Delta
from turnout.serving.core_client import multiprocessing_enabled
from turnout.serving.core_loop import AbortAll, AbortRequest, AddRequest, CoreLoop, StepUpdate

COMMON = ("--max-model-len", "256", "--num-kv-blocks", "64", "--seed", "0")


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (read from /proc), multiprocessing's
    resource tracker left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) != pid or fields[0] == "Z":
            continue
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def complete(server: Server, **extra: object) -> dict:
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, **extra}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_env_switch_reads_as_vllms() -> None:
    assert multiprocessing_enabled({})
    assert multiprocessing_enabled({"TURNOUT_ENABLE_MULTIPROCESSING": "1"})
    for off in ("0", "false", "No", " off "):
        assert not multiprocessing_enabled({"TURNOUT_ENABLE_MULTIPROCESSING": off})


def test_both_placements_answer_alike_and_the_core_process_follows_the_server(
    tmp_path: Path,
) -> None:
    in_thread = start_server(
        SMOLLM2,
        tmp_path / "thread.log",
        *COMMON,
        env={"TURNOUT_ENABLE_MULTIPROCESSING": "0", "TURNOUT_DEPLOYMENT_ID": "demo-dep"},
    )
    in_process = start_server(SMOLLM2, tmp_path / "process.log", *COMMON)
    try:
        assert children(in_thread.proc.pid) == []  # one process
        # runner_info's deployment is the canary split's: TURNOUT_DEPLOYMENT_ID, else the host
        assert 'deployment="demo-dep"' in in_thread.metrics_text()
        assert f'deployment="{socket.gethostname()}"' in in_process.metrics_text()
        (core_pid,) = children(in_process.proc.pid)
        a, b = complete(in_thread), complete(in_process)
        assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["usage"] == b["usage"]
        seeded = {"temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 12}
        assert [c["text"] for c in complete(in_thread, **seeded)["choices"]] == [
            c["text"] for c in complete(in_process, **seeded)["choices"]
        ]
        # kill -9 of the server: the engine-core process sees its pipe close and exits.
        in_process.proc.send_signal(signal.SIGKILL)
        in_process.proc.wait(10)
        deadline = time.monotonic() + 30
        while alive(core_pid):
            assert time.monotonic() < deadline, "the engine-core process outlived its server"
            time.sleep(0.1)
    finally:
        in_thread.stop()
        in_process.stop()
    assert "(engine core)" in in_process.log.read_text()  # its log lines reach the server's
    assert "engine core: stepped by a thread of this process" in in_thread.log.read_text()


def test_a_dead_engine_core_fails_what_runs_and_health_says_so(tmp_path: Path) -> None:
    server = start_server(SMOLLM2, tmp_path / "dies.log", *COMMON)
    try:
        (core_pid,) = children(server.proc.pid)
        body = {"prompt": "Once upon a time", "max_tokens": 200, "stream": True, "ignore_eos": True}
        finish = None
        with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    finish = "error"
                    break
                if chunk["choices"][0]["finish_reason"] is not None:
                    finish = chunk["choices"][0]["finish_reason"]
                    break
                os.kill(core_pid, signal.SIGKILL)  # after the first chunk
        assert finish == "error"  # ended, not hung, and not passed off as a finished answer
        assert httpx.get(server.url + "/health", timeout=10).status_code == 503
        ready = httpx.get(server.url + "/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["failed"] is True  # routed away
        metrics = server.metrics_text()  # nothing runs or holds KV blocks any more
        assert "vllm:num_requests_running{" in metrics
        for line in metrics.splitlines():
            if line.startswith(("vllm:num_requests_running{", "vllm:kv_cache_usage_perc{")):
                assert float(line.rsplit(" ", 1)[1]) == 0.0, line
        r = httpx.post(server.base_url + "/completions", json={"prompt": "Hi"}, timeout=10)
        assert r.status_code >= 500 and "engine" in r.json()["error"]["message"]
    finally:
        server.stop()
    assert "the engine-core process exited" in server.log.read_text()


def test_sigterm_while_the_core_process_loads_exits_0_and_leaves_no_engine(
    tmp_path: Path,
) -> None:
    log = tmp_path / "early.log"
    proc, _port = spawn_server(SMOLLM2, log, *COMMON)
    try:
        deadline = time.monotonic() + 120
        while "is loading the model" not in log.read_text():  # the core process started
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        (core_pid,) = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()  # it once waited for the core forever
        assert not alive(core_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "the model failed to load" not in log.read_text()  # stopped on purpose


def test_deltas_merge_in_order() -> None:
    lp = Logprobs.empty(2)
    first = Delta([1, 2], "ab", lp, num_output_tokens=2)
    later = Delta([3], "c", None, finish_reason="length", num_output_tokens=3)
    merged = first.merge(later)
    assert merged.token_ids == [1, 2, 3] and merged.text == "abc"
    assert merged.finish_reason == "length" and merged.num_output_tokens == 3
    assert merged.logprobs is lp


@pytest.fixture(scope="module")
def core() -> object:
    from turnout.engine.llm import LLM

    llm = LLM(SMOLLM2, "v1", max_model_len=128, num_kv_blocks=32, seed=0)
    yield llm.core
    llm.shutdown()


def test_the_loop_admits_refuses_steps_and_aborts_on_a_real_core(core: object) -> None:
    loop = CoreLoop(core)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    first = loop.iterate(
        [
            AddRequest("a", [1, 2, 3], params),
            AddRequest("too-long", list(range(1, 200)), params),
            AddRequest("b", [4, 5, 6], params),
        ]
    )
    assert first is not None and first.stepped
    refusals = dict(first.admissions)
    assert refusals["a"] is None and refusals["b"] is None
    assert refusals["too-long"] is not None and "max_model_len" in refusals["too-long"]
    updates: list[StepUpdate] = [first]
    updates.append(loop.iterate([AbortRequest("b")]) or StepUpdate())
    while core.has_unfinished_requests():  # type: ignore[attr-defined]
        update = loop.iterate([])
        assert update is not None
        updates.append(update)
    records = [r for u in updates for r in u.requests]
    tokens_a = [t for r in records if r.req_id == "a" for t in r.new_token_ids]
    assert len(tokens_a) == 5
    finishes = {r.req_id: r.finish_reason for r in records if r.finish_reason}
    assert finishes == {"a": "length", "b": "abort"}
    assert [r.first_scheduled for r in records if r.req_id == "a"].count(True) == 1
    assert updates[-1].num_running == 0 and updates[-1].kv_cache_usage == 0
    assert loop.iterate([]) is None  # idle, nothing asked: nothing to say
    # abort_all on an idle loop still answers with the gauges
    idle = loop.iterate([AbortAll()])
    assert idle is not None and not idle.stepped and idle.requests == []


def test_sending_never_waits_on_a_full_command_pipe() -> None:
    """Commands go through the client's sender thread: with nobody reading the pipe (an
    engine core deep in a long step), ``send`` still returns at once. It once wrote the pipe
    itself, from the event loop and from the thread that reads the updates, and a full pipe
    deadlocked a busy server."""
    import multiprocessing as mp

    from turnout.serving.core_client import ProcessCore
    from turnout.serving.startup import EngineInfo

    commands_r, commands_w = mp.Pipe(duplex=False)
    updates_r, updates_w = mp.Pipe(duplex=False)
    info = EngineInfo({}, "v1", "auto", "", "", "", 256, "generate")
    client = ProcessCore(None, commands_w, updates_r, info)
    big = AddRequest("r", list(range(4096)))  # ~20 KB pickled: a few fill the pipe
    caller = threading.Thread(target=lambda: [client.send(big) for _ in range(200)])
    caller.start()
    caller.join(60)  # a guard against a hang, not a timing
    assert not caller.is_alive()  # every send returned with nobody reading the pipe
    received = 0
    while received < 200:  # the reader catches up: every command arrives, in order
        assert commands_r.recv() == big
        received += 1
    for conn in (commands_r, commands_w, updates_r, updates_w):
        conn.close()
