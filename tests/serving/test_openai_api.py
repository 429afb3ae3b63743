"""The official ``openai`` client against real ``turnout engine serve`` processes on loopback,
with the shipped SmolLM2-135M-Instruct (Q4_1 GGUF) on CPU: one server the rollout sends to
runner_v1 (auto: V2 does not run on CPU unless pinned) with its engine core in a process of
its own (the default), one pinned to runner_v2 (its kernels through the Triton interpreter)
behind an API key, its core stepped by a thread of the server's process
(``TURNOUT_ENABLE_MULTIPROCESSING=0``). Every test then covers both placements."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_helpers import SMOLLM2, Server, start_server

KEY = "sk-turnout-test"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("serve")
    common = ("--served-model-name", "smollm2", "--max-model-len", "256", "--num-kv-blocks", "64")
    started: dict[str, Server] = {}
    try:
        started["v1"] = start_server(SMOLLM2, logs / "v1.log", *common)
        started["v2"] = start_server(
            SMOLLM2,
            logs / "v2.log",
            *common,
            "--runner",
            "v2",
            "--api-key",
            KEY,
            env={"TURNOUT_ENABLE_MULTIPROCESSING": "0"},
        )
        yield started
    finally:
        for server in started.values():
            server.stop()


def client(server: Server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def metric(server: Server, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_models_name_the_runner_the_rollout_chose_and_the_pin(servers: dict[str, Server]) -> None:
    for runner, server in servers.items():
        r = httpx.get(server.base_url + "/models", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.headers["x-turnout-runner"] == runner
        (model,) = r.json()["data"]
        assert model["id"] == "smollm2" and model["max_model_len"] == 256
        assert model["turnout"]["runner"] == runner
        assert model["turnout"]["decision"]["mode"] == ("auto" if runner == "v1" else "pinned")
    assert [m.id for m in client(servers["v1"]).models.list()] == ["smollm2"]


def test_greedy_completion_and_chat_agree_on_both_runners(servers: dict[str, Server]) -> None:
    texts = {}
    for runner, server in servers.items():
        c = client(server)
        done = c.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=0)
        (choice,) = done.choices
        assert choice.finish_reason == "length"
        assert done.usage is not None and done.usage.completion_tokens == 6
        assert done.usage.prompt_tokens == done.usage.total_tokens - 6
        chat = c.chat.completions.create(
            model="smollm2", messages=CHAT, max_tokens=8, temperature=0
        )
        assert chat.choices[0].message.role == "assistant"
        texts[runner] = (choice.text, chat.choices[0].message.content)
    assert texts["v1"] == texts["v2"]
    assert "Paris" in texts["v1"][0] and "Paris" in texts["v1"][1]


def test_streaming_gives_the_same_text_and_usage_last(servers: dict[str, Server]) -> None:
    c = client(servers["v1"])
    whole = c.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=8, temperature=0)
    chunks = list(
        c.chat.completions.create(
            model="smollm2",
            messages=CHAT,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    streamed = c.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=6, temperature=0, stream=True
    )
    whole_text = c.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=0)
    assert "".join(ch.choices[0].text for ch in streamed) == whole_text.choices[0].text


def test_seeded_n2_samples_are_reproducible_across_runners(servers: dict[str, Server]) -> None:
    got = {}
    for runner, server in servers.items():
        r = client(server).completions.create(
            model="smollm2", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=42, n=2
        )
        assert [c.index for c in r.choices] == [0, 1]
        got[runner] = [c.text for c in r.choices]
        assert r.usage is not None and r.usage.completion_tokens == 16
    # The Gumbel noise is a function of (seed, position, token): the same draws on both runners.
    assert got["v1"] == got["v2"]
    assert got["v1"][0] != got["v1"][1]  # child i samples with seed + i, as vLLM's n does
    # With a nucleus the choices repeat by seed on a runner (across runners a token at the
    # top_p boundary may fall on either side of it: the logits agree to float32 rounding).
    nucleus = {
        "model": "smollm2",
        "prompt": PROMPT,
        "max_tokens": 8,
        "top_p": 0.9,
        "seed": 7,
        "n": 2,
    }
    c = client(servers["v1"])
    first = [x.text for x in c.completions.create(**nucleus).choices]  # type: ignore[call-overload]
    assert [x.text for x in c.completions.create(**nucleus).choices] == first  # type: ignore[call-overload]


def test_min_p_is_accepted_and_sampled_alike_on_both_runners(servers: dict[str, Server]) -> None:
    # Per runner, three requests batched together: seeded with min_p 0.1; min_p 1, which keeps
    # only the most likely token, so a sampled answer is the greedy one; greedy.
    async def ask(server: Server) -> list[str]:
        ac = openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)
        kinds = [
            {"temperature": 1.0, "seed": 11, "extra_body": {"min_p": 0.1}},
            {"temperature": 1.0, "seed": 3, "extra_body": {"min_p": 1.0}},
            {"temperature": 0},
        ]
        try:
            done = await asyncio.gather(
                *(
                    ac.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, **kw)
                    for kw in kinds
                )
            )
        finally:
            await ac.close()
        return [d.choices[0].text for d in done]

    async def both() -> dict[str, list[str]]:
        texts = await asyncio.gather(*(ask(server) for server in servers.values()))
        return dict(zip(servers, texts, strict=True))

    got = asyncio.run(both())
    for runner, (_, kept_top, greedy) in got.items():
        assert kept_top == greedy, runner
    # The same Gumbel noise over the same kept tokens (docs/sampling.md step 6).
    assert got["v1"][0] == got["v2"][0]


def test_a_stop_string_ends_the_text_before_it(servers: dict[str, Server]) -> None:
    c = client(servers["v1"])
    free = c.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0)
    text = free.choices[0].text
    stop = text[3:6]  # a stop string that starts inside a token
    r = c.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop]
    )
    choice = r.choices[0]
    assert choice.text == text[: text.index(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra is not None and choice.model_extra["stop_reason"] == stop
    streamed = c.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop], stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed) == choice.text


def test_logprobs_in_both_shapes(servers: dict[str, Server]) -> None:
    c = client(servers["v2"])
    r = c.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.top_logprobs is not None and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert lp.token_logprobs is not None and all(v <= 0 for v in lp.token_logprobs)
    chat = c.chat.completions.create(
        model="smollm2", messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    # Greedy: the sampled token is the most likely one.
    assert all(len(e.top_logprobs) == 3 and e.token == e.top_logprobs[0].token for e in content)


def test_sixteen_concurrent_streams_each_get_their_own_answer(servers: dict[str, Server]) -> None:
    server = servers["v1"]
    prompts = [f"Count from {i}:" for i in range(16)]
    alone = {
        p: client(server)
        .completions.create(model="smollm2", prompt=p, max_tokens=5, temperature=0)
        .choices[0]
        .text
        for p in prompts[:3]
    }

    async def run() -> list[str]:
        ac = openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)

        async def one(p: str) -> str:
            stream = await ac.completions.create(
                model="smollm2", prompt=p, max_tokens=5, temperature=0, stream=True
            )
            return "".join([ch.choices[0].text async for ch in stream])

        try:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        finally:
            await ac.close()

    before = metric(server, "vllm:request_success_total", finished_reason="length")
    texts = asyncio.run(run())
    assert all(t for t in texts)
    for p, t in zip(prompts, texts, strict=True):
        if p in alone:  # batched with fifteen others, greedy gives what it gives alone
            assert t == alone[p]
    assert metric(server, "vllm:request_success_total", finished_reason="length") == before + 16


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": PROMPT, "max_tokens": 300}, "max_tokens"),  # over max_model_len 256
        ({"prompt": PROMPT, "n": 0}, "n"),
        ({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
        ({"prompt": PROMPT, "min_p": 1.5}, "min_p"),  # vLLM's range: [0, 1]
        ({"prompt": PROMPT, "min_p": -0.1}, "min_p"),
        ({"prompt": PROMPT, "logit_bias": {"1": 5}}, "logit_bias"),
        ({"prompt": PROMPT, "bogus_field": 1}, "bogus_field"),
        ({"prompt": [], "max_tokens": 2}, "prompt"),
        ({"prompt": [999999], "max_tokens": 2}, None),  # outside the vocabulary: the engine says
        ({}, "prompt"),
    ],
)
def test_bad_parameters_get_400_in_openais_shape(
    servers: dict[str, Server], body: dict, param: str | None
) -> None:
    r = httpx.post(servers["v1"].base_url + "/completions", json={"model": "smollm2", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    if param is not None:
        assert error["param"] == param or error["param"].startswith(param)
    if "prompt" in body:  # the same through the official client, which raises its own class
        with pytest.raises(openai.BadRequestError):
            client(servers["v1"]).completions.create(model="smollm2", prompt="", extra_body=body)


def test_unknown_model_malformed_bodies_and_keys(servers: dict[str, Server]) -> None:
    with pytest.raises(openai.NotFoundError):  # vLLM answers an unknown model with 404
        client(servers["v1"]).completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        client(servers["v2"], key="wrong").completions.create(model="smollm2", prompt=PROMPT)
    url = servers["v1"].base_url + "/chat/completions"
    for raw in (b"{", b"[]", b"null", b'{"messages": "hi"}', b"\xff\xfe", b'{"messages": []}'):
        r = httpx.post(url, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert r.json()["error"]["code"] == 400
    # The server still answers after all of them.
    ok = client(servers["v1"]).completions.create(model="smollm2", prompt=PROMPT, max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


def test_a_client_that_leaves_mid_stream_frees_its_slot(servers: dict[str, Server]) -> None:
    server = servers["v1"]
    aborted = metric(server, "vllm:request_success_total", finished_reason="abort")
    body = {
        "model": "smollm2",
        "prompt": PROMPT,
        "max_tokens": 200,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):  # three chunks in: it is running and holds KV blocks
            while not next(lines).startswith("data: "):
                pass
        assert metric(server, "vllm:num_requests_running") == 1
        assert metric(server, "vllm:kv_cache_usage_perc") > 0
    # Closed: the request is aborted in the scheduler and its blocks return.
    for _ in range(100):
        if metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1
    assert metric(server, "vllm:num_requests_running") == 0
    assert metric(server, "vllm:kv_cache_usage_perc") == 0


def test_histograms_and_counters_move_with_the_traffic(servers: dict[str, Server]) -> None:
    server = servers["v1"]
    names = (
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prompt_tokens_count",
    )
    before = {n: metric(server, n) for n in names}
    tokens = metric(server, "vllm:generation_tokens_total")
    itl = metric(server, "vllm:inter_token_latency_seconds_count")
    client(server).completions.create(model="smollm2", prompt=PROMPT, max_tokens=5, temperature=0)
    for n in names:
        assert metric(server, n) == before[n] + 1, n
    assert metric(server, "vllm:generation_tokens_total") == tokens + 5
    assert metric(server, "vllm:inter_token_latency_seconds_count") == itl + 4
    info = [
        s
        for f in text_string_to_metric_families(server.metrics_text())
        for s in f.samples
        if s.name == "turnout:runner_info"
    ]
    assert [(s.labels["runner"], s.labels["mode"], s.value) for s in info] == [("v1", "auto", 1.0)]


def test_the_log_names_the_runner_and_why(servers: dict[str, Server]) -> None:
    v1 = servers["v1"].log.read_text()
    assert "serving smollm2 on runner v1 (chosen by the oracle" in v1
    assert "serving smollm2 on runner v2 (pinned by --runner" in servers["v2"].log.read_text()


def test_health_version_and_metrics_need_no_key(servers: dict[str, Server]) -> None:
    server = servers["v2"]
    assert httpx.get(server.url + "/health").status_code == 200
    ready = httpx.get(server.url + "/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert httpx.get(server.url + "/version").json()["runner"] == "v2"
    assert "vllm:num_requests_running" in server.metrics_text()
    assert json.loads(httpx.get(server.url + "/version").text)["version"]


def test_logs_hold_no_traceback(servers: dict[str, Server]) -> None:
    for server in servers.values():
        assert "Traceback" not in server.log.read_text(), server.log.read_text()


def test_hostile_bodies_found_by_review_get_4xx_and_the_connection_survives(
    servers: dict[str, Server],
) -> None:
    url = servers["v1"].base_url
    with httpx.Client() as http:  # one keep-alive connection for every request below
        for raw in (
            b'{"model": "\\ud800", "prompt": "hi"}',  # a lone surrogate: valid JSON, no text
            b'{"prompt": "\\ud800 hi", "max_tokens": 2}',
        ):
            r = http.post(
                url + "/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
        chat = b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'
        r = http.post(
            url + "/chat/completions", content=chat, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        fan = {"prompt": [[1, 2, 3]] * 64, "n": 128, "max_tokens": 1}  # 8,192 sequences
        r = http.post(url + "/completions", json=fan)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        r = http.get(url + "/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == 405
        r = http.get(url + "/no-such-route")
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
        ok = http.post(url + "/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert ok.status_code == 200  # the same connection still serves
