"""The scheduler over a runner with a real paged KV store (tests/engine/replay_runner.py):
chunked-prefill boundaries, preemption and resume, prefix caching, speculation, stop
conditions, and no leaked blocks after 1,000 random requests."""

from __future__ import annotations

import random

import pytest
from replay_runner import ReplayRunner, drive_random_requests, reference_generate

from turnout.engine.config import EngineConfig, SpeculativeConfig
from turnout.engine.core import EngineCore
from turnout.engine.request import Request, RequestStatus
from turnout.engine.sampling_params import SamplingParams

VOCAB = 97
EOS = 0


def make_engine(
    num_blocks: int = 64, propose: str = "none", **kwargs: object
) -> tuple[EngineCore, ReplayRunner]:
    kwargs.setdefault("max_model_len", 256)
    config = EngineConfig(model="replay", vocab_size=VOCAB, eos_token_ids=(EOS,), **kwargs)  # type: ignore[arg-type]
    runner = ReplayRunner(config, propose)
    runner.initialize_kv_cache(num_blocks)
    return EngineCore(config, runner, num_blocks), runner


def check_against_reference(
    core: EngineCore, done: list[Request], prompts: dict[str, list[int]]
) -> None:
    assert {r.req_id for r in done} == set(prompts)
    for req in done:
        assert req.sampling_params is not None
        want, reason = reference_generate(
            prompts[req.req_id], req.sampling_params, {EOS}, VOCAB, core.config.max_model_len
        )
        assert req.output_token_ids == want, req.req_id
        assert req.status.finish_reason == reason


def assert_no_leaks(core: EngineCore) -> None:
    kv = core.scheduler.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks
    assert not kv.req_to_blocks
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    assert not core.scheduler.running and not core.scheduler.waiting and not core.scheduler.requests


def prompt_of(n: int, salt: int = 1) -> list[int]:
    return [(i * 7 + salt) % (VOCAB - 1) + 1 for i in range(n)]


# Prompt lengths around multiples of block_size (16) and of the token budget.
BOUNDARIES = [
    (length, budget)
    for budget in (16, 24, 32, 40)
    for length in sorted(
        {
            1,
            15,
            16,
            17,
            31,
            32,
            33,
            budget - 1,
            budget,
            budget + 1,
            2 * budget - 1,
            2 * budget,
            2 * budget + 1,
            3 * budget,
        }
    )
    if length >= 1
]


@pytest.mark.parametrize(("length", "budget"), BOUNDARIES)
def test_chunked_prefill_boundaries(length: int, budget: int) -> None:
    core, runner = make_engine(max_num_batched_tokens=budget, block_size=16)
    core.add_request("a", prompt_of(length), SamplingParams(max_tokens=3, ignore_eos=True))
    chunks = []
    done: list[Request] = []
    while core.has_unfinished_requests():
        req = core.scheduler.requests["a"]
        before = req.num_computed_tokens
        done += core.step()
        chunks.append(req.num_computed_tokens - before)
    # Prefill in full-budget chunks then the remainder; then one token per decode step.
    num_full, rest = divmod(length, budget)
    want = [budget] * num_full + ([rest] if rest else [])
    want += [1, 1]  # outputs 2 and 3 (output 1 comes with the last prefill chunk)
    assert chunks == want
    check_against_reference(core, done, {"a": prompt_of(length)})
    assert runner.max_tokens_in_step <= budget
    assert_no_leaks(core)


@pytest.mark.parametrize("budget", [16, 17, 33])
@pytest.mark.parametrize("block_size", [4, 16])
def test_chunked_prefill_with_many_requests(budget: int, block_size: int) -> None:
    core, runner = make_engine(max_num_batched_tokens=budget, block_size=block_size, num_blocks=200)
    prompts = {f"r{i}": prompt_of(n, salt=i) for i, n in enumerate([1, 15, 16, 17, 33, 48, 2, 64])}
    for req_id, prompt in prompts.items():
        core.add_request(req_id, prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    done = core.run_until_done()
    check_against_reference(core, done, prompts)
    assert runner.max_tokens_in_step == budget
    assert_no_leaks(core)


def test_no_chunked_prefill_waits_for_room() -> None:
    core, _ = make_engine(max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False)
    core.add_request("a", prompt_of(40), SamplingParams(max_tokens=2, ignore_eos=True))
    core.add_request("b", prompt_of(40, 2), SamplingParams(max_tokens=2, ignore_eos=True))
    out = core.scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 40}  # b does not fit the rest of the budget


# (blocks, block_size, max_num_seqs, prompt lengths, max_tokens): caches too small for all.
PREEMPTION = [
    (6, 16, 4, [30, 30, 30, 30], 40),
    (5, 4, 3, [3, 9, 5], 10),
    (10, 8, 8, [20, 12, 1, 7, 30, 2, 9, 15], 25),
    (8, 16, 2, [60, 60], 40),
]


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "max_num_seqs", "lengths", "max_tokens"), PREEMPTION
)
def test_preemption_and_resume_give_the_same_outputs(
    num_blocks: int, block_size: int, max_num_seqs: int, lengths: list[int], max_tokens: int
) -> None:
    kwargs = {"block_size": block_size, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 32}
    prompts = {f"r{i}": prompt_of(n, i) for i, n in enumerate(lengths)}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=2, logprobs=1)
    core, _ = make_engine(num_blocks=num_blocks, **kwargs)
    roomy, _ = make_engine(num_blocks=500, **kwargs)
    results = []
    for engine in (core, roomy):
        for req_id, prompt in prompts.items():
            engine.add_request(req_id, prompt, params)
        results.append({r.req_id: r for r in engine.run_until_done()})
        assert_no_leaks(engine)
    small, big = results
    assert sum(r.num_preemptions for r in small.values()) > 0
    assert sum(r.num_preemptions for r in big.values()) == 0
    for req_id, req in small.items():
        assert req.output_token_ids == big[req_id].output_token_ids
        # Prompt logprobs: one entry per prompt token after the first, delivered once.
        assert req.num_prompt_logprobs == len(prompts[req_id]) - 1
        assert sum(len(c) for c in req.prompt_logprobs) == len(prompts[req_id]) - 1
        got = [t for c in req.prompt_logprobs for t in c.token_ids[:, 0].tolist()]
        assert got == prompts[req_id][1:]
        assert sum(len(c) for c in req.logprobs) == len(req.output_token_ids)
    check_against_reference(core, list(small.values()), prompts)


def test_preemption_takes_the_newest_first() -> None:
    core, _ = make_engine(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    for i in range(3):
        core.add_request(f"r{i}", prompt_of(4, i), SamplingParams(max_tokens=8, ignore_eos=True))
    core.step()  # r0, r1, r2 prefilled: 3 blocks used, 1 free
    # Each now needs a 2nd block: r0 takes the free one; r1 gets r2's after r2 is preempted.
    out = core.scheduler.schedule()
    assert out.preempted_req_ids == {"r2"} and set(out.num_scheduled_tokens) == {"r0", "r1"}
    assert [r.req_id for r in core.scheduler.running] == ["r0", "r1"]
    assert [r.req_id for r in core.scheduler.waiting] == ["r2"]
    assert core.scheduler.requests["r2"].status == RequestStatus.PREEMPTED
    assert core.scheduler.requests["r2"].num_computed_tokens == 0


def test_prefix_cache_hits_are_counted_and_correct() -> None:
    core, runner = make_engine(block_size=16)
    shared = prompt_of(40)
    core.add_request("a", shared, SamplingParams(max_tokens=2, ignore_eos=True))
    core.run_until_done()
    writes = runner.num_kv_writes
    prompts = {"b": [*shared, 5, 6], "c": shared[:33], "d": [3, *shared]}
    for req_id, prompt in prompts.items():
        core.add_request(req_id, prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    done = core.run_until_done()
    hits = {r.req_id: r.num_cached_tokens for r in done}
    assert hits == {"b": 32, "c": 32, "d": 0}
    # Hits are not recomputed: b and c wrote 42-32 + 33-32 prompt slots, d all 41, plus decodes.
    assert runner.num_kv_writes - writes == (10 + 1 + 41) + 3 * 1
    check_against_reference(core, done, prompts)
    assert_no_leaks(core)


@pytest.mark.parametrize("propose", ["right", "mixed"])
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_tokens_are_scheduled_and_rolled_back(propose: str, k: int) -> None:
    prompts = {f"r{i}": prompt_of(n, i) for i, n in enumerate([5, 17, 30])}
    spec = SpeculativeConfig(num_speculative_tokens=k)
    core, runner = make_engine(
        propose=propose, speculative_config=spec, block_size=4, num_blocks=100
    )
    plain, plain_runner = make_engine(block_size=4, num_blocks=100)
    for engine in (core, plain):
        for req_id, prompt in prompts.items():
            engine.add_request(req_id, prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    done = core.run_until_done()
    check_against_reference(core, done, prompts)
    check_against_reference(plain, plain.run_until_done(), prompts)
    if propose == "right":
        assert runner.num_steps < plain_runner.num_steps
    assert_no_leaks(core)


STOPS = [
    ("max_tokens", SamplingParams(max_tokens=4, ignore_eos=True), "length"),
    (
        "min_tokens with ignore_eos",
        SamplingParams(max_tokens=30, min_tokens=30, ignore_eos=True),
        "length",
    ),
    ("stop id", None, "stop"),
    ("eos", SamplingParams(max_tokens=200), "stop"),
]


@pytest.mark.parametrize(("note", "params", "reason"), STOPS, ids=[s[0] for s in STOPS])
def test_finish_reasons(note: str, params: SamplingParams | None, reason: str) -> None:
    prompt = prompt_of(9)
    if params is None:  # stop on the 3rd token the hash model produces
        third = reference_generate(
            prompt, SamplingParams(max_tokens=3, ignore_eos=True), set(), VOCAB, 256
        )[0][2]
        params = SamplingParams(max_tokens=50, stop_token_ids=[third], ignore_eos=True)
    core, _ = make_engine(max_model_len=1000)
    core.add_request("a", prompt, params)
    (req,) = core.run_until_done()
    assert req.status.finish_reason == reason
    check_against_reference(core, [req], {"a": prompt})
    if note == "stop id":
        assert req.stop_reason == params.stop_token_ids[0] and len(req.output_token_ids) == 3


def test_max_model_len_caps_generation() -> None:
    core, _ = make_engine(max_model_len=20)
    core.add_request("a", prompt_of(18), SamplingParams(max_tokens=10, ignore_eos=True))
    (req,) = core.run_until_done()
    assert len(req.output_token_ids) == 2 and req.status.finish_reason == "length"


def test_max_num_seqs_bounds_each_step() -> None:
    core, _ = make_engine(max_num_seqs=3)
    for i in range(7):
        core.add_request(f"r{i}", prompt_of(3, i), SamplingParams(max_tokens=4, ignore_eos=True))
    while core.has_unfinished_requests():
        out = core.scheduler.schedule()
        assert len(out.num_scheduled_tokens) <= 3
        core.scheduler.update_from_output(out, core.runner.execute_model(out))


def test_abort_frees_everything() -> None:
    core, _ = make_engine()
    core.add_request("a", prompt_of(30), SamplingParams(max_tokens=50, ignore_eos=True))
    core.add_request("b", prompt_of(30, 2), SamplingParams(max_tokens=50, ignore_eos=True))
    core.step()
    assert core.abort_request("a").status == RequestStatus.FINISHED_ABORTED
    assert core.abort_request("missing") is None
    out = core.scheduler.schedule()
    assert out.finished_req_ids == {"a"} and "a" not in out.num_scheduled_tokens
    core.scheduler.update_from_output(out, core.runner.execute_model(out))
    core.run_until_done()
    assert_no_leaks(core)


def test_a_thousand_random_requests_leak_nothing() -> None:
    rng = random.Random(1234)
    core, _ = make_engine(
        num_blocks=40,
        block_size=4,
        max_num_seqs=12,
        max_num_batched_tokens=48,
        max_model_len=96,
        speculative_config=SpeculativeConfig(num_speculative_tokens=2),
        propose="mixed",
    )
    done, prompts = drive_random_requests(core, rng, prompt_of(24, 99), VOCAB)
    check_against_reference(core, done, prompts)
    for req in done:
        if req.wants_prompt_logprobs:
            assert req.num_prompt_logprobs == req.num_prompt_tokens - 1
    assert sum(r.num_preemptions for r in done) > 0
    assert core.scheduler.kv_cache_manager.prefix_cache_stats.num_hit_tokens > 0
    assert_no_leaks(core)
