"""SIGTERM drains a real server: readiness turns false, new requests get 503, the eight
streams in flight all run to their last token, and the process exits 0. A full waiting queue
answers 503 with Retry-After and counts vLLM's ``admission_rejections``."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving_helpers import SMOLLM2, Server, start_server

PROMPT = "Once upon a time"


def stream_completion(server: Server, started: threading.Barrier | None, max_tokens: int) -> dict:
    """One streamed completion; waits at ``started`` after its first chunk."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    text, finish, num_chunks = "", None, 0
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            num_chunks += 1
            text += chunk["choices"][0]["text"]
            finish = chunk["choices"][0]["finish_reason"] or finish
            if num_chunks == 1 and started is not None:
                started.wait(60)
    return {"text": text, "finish_reason": finish, "num_chunks": num_chunks}


def test_sigterm_drains_eight_streams_and_exits_0(tmp_path: Path) -> None:
    server = start_server(
        SMOLLM2, tmp_path / "drain.log", "--max-model-len", "256", "--max-num-seqs", "8",
        "--drain-timeout", "300",
    )  # fmt: skip
    try:
        started = threading.Barrier(9)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(stream_completion, server, started, 12) for _ in range(8)]
            started.wait(120)  # every stream has its first chunk
            server.terminate()
            deadline = time.monotonic() + 10
            while httpx.get(server.url + "/ready").status_code != 503:
                assert time.monotonic() < deadline, "readiness never turned false"
                time.sleep(0.05)
            refused = httpx.post(server.base_url + "/completions", json={"prompt": PROMPT})
            assert refused.status_code == 503 and refused.headers["retry-after"]
            assert refused.json()["error"]["type"] == "ServiceUnavailableError"
            results = [f.result(timeout=300) for f in futures]
        assert [r["finish_reason"] for r in results] == ["length"] * 8
        assert all(r["text"] for r in results)
        assert server.proc.wait(60) == 0
    finally:
        server.stop()
    log = server.log.read_text()
    assert "SIGTERM: draining 8 requests in flight" in log and "drained" in log
    assert "Traceback" not in log


def test_a_drain_timeout_aborts_what_is_left_and_still_exits_0(tmp_path: Path) -> None:
    server = start_server(
        SMOLLM2, tmp_path / "cut.log", "--max-model-len", "256", "--drain-timeout", "0.5"
    )
    try:
        started = threading.Barrier(2)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(stream_completion, server, started, 220)
            started.wait(120)
            server.terminate()
            result = future.result(timeout=120)
        assert result["finish_reason"] == "abort"  # cut at the timeout, and said so
        assert server.proc.wait(60) == 0
    finally:
        server.stop()
    log = server.log.read_text()
    assert "drain timeout (0.5 s): aborting 1 requests still in flight" in log
    assert "were aborted" in log and "every request finished" not in log  # said as it was


@pytest.mark.parametrize("bound", [1])
def test_a_full_waiting_queue_answers_503_with_retry_after(tmp_path: Path, bound: int) -> None:
    server = start_server(
        SMOLLM2, tmp_path / "queue.log", "--max-model-len", "256", "--max-num-seqs", "1",
        "--max-num-queued-reqs", str(bound),
    )  # fmt: skip
    try:
        body = {"prompt": PROMPT, "max_tokens": 16, "ignore_eos": True}

        def post() -> httpx.Response:
            return httpx.post(server.base_url + "/completions", json=body, timeout=120)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: post(), range(6)))
        codes = sorted(a.status_code for a in answers)
        assert 200 in codes and 503 in codes, codes
        for a in answers:
            if a.status_code == 503:
                assert a.headers["retry-after"] == "1"
                assert "--max-num-queued-reqs" in a.json()["error"]["message"]
        # One request of n sequences counts n against the bound (it cannot slip past it).
        fan = httpx.post(server.base_url + "/completions", json={**body, "n": 8}, timeout=120)
        assert fan.status_code == 503 and "8 more request(s)" in fan.json()["error"]["message"]
        rejected = sum(a.status_code == 503 for a in answers) + 1
        metrics = httpx.get(server.url + "/metrics").text
        line = f'vllm:admission_rejections_total{{model_name="{SMOLLM2}",reason="max_num_queued_reqs"}}'
        assert f"{line} {float(rejected)}" in metrics
    finally:
        server.stop()
