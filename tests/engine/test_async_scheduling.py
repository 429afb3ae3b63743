"""Asynchronous scheduling (runner_v2's loop): step N+1 is planned and launched before step N's
tokens are applied. Driven by the replay runner (a real paged KV store, tokens kept on the
runner's side as runner_v2 keeps them on the device), every workload must give the outputs of
the reference, exactly as the synchronous loop does."""

from __future__ import annotations

import random

import pytest
from replay_runner import ReplayRunner, drive_random_requests, reference_generate

from turnout.engine.config import EngineConfig
from turnout.engine.core import EngineCore
from turnout.engine.outputs import ModelRunnerOutput
from turnout.engine.request import Request
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput

VOCAB = 97
EOS = 0


class _Pending:
    """An ``AsyncModelRunnerOutput``: the result is handed over only when collected."""

    def __init__(self, output: ModelRunnerOutput, runner: AsyncReplayRunner) -> None:
        self._output = output
        self._runner = runner

    def get_output(self) -> ModelRunnerOutput:
        self._runner.num_collected += 1
        return self._output


class AsyncReplayRunner(ReplayRunner):
    """The replay runner returning deferred outputs, recording how far ahead the engine plans."""

    async_scheduling = True

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.num_collected = 0
        self.num_launched = 0
        self.max_ahead = 0
        self.scheduled: list[SchedulerOutput] = []

    def execute_model(self, so: SchedulerOutput) -> _Pending:  # type: ignore[override]
        self.scheduled.append(so)
        out = super().execute_model(so)
        if not so.is_empty:  # an empty step only drops finished requests; nobody collects it
            self.num_launched += 1
            self.max_ahead = max(self.max_ahead, self.num_launched - self.num_collected)
        return _Pending(out, self)


def make_engine(num_blocks: int = 64, **kwargs: object) -> tuple[EngineCore, AsyncReplayRunner]:
    kwargs.setdefault("max_model_len", 256)
    config = EngineConfig(model="replay", vocab_size=VOCAB, eos_token_ids=(EOS,), **kwargs)  # type: ignore[arg-type]
    runner = AsyncReplayRunner(config)
    runner.initialize_kv_cache(num_blocks)
    return EngineCore(config, runner, num_blocks), runner


def prompt_of(n: int, salt: int = 1) -> list[int]:
    return [(i * 7 + salt) % (VOCAB - 1) + 1 for i in range(n)]


def check(core: EngineCore, done: list[Request], prompts: dict[str, list[int]]) -> None:
    assert sorted(r.req_id for r in done) == sorted(prompts)
    for req in done:
        assert req.sampling_params is not None
        want, reason = reference_generate(
            prompts[req.req_id], req.sampling_params, {EOS}, VOCAB, core.config.max_model_len
        )
        assert req.output_token_ids == want, req.req_id
        assert req.status.finish_reason == reason
        assert req.num_output_placeholders == 0
    kv = core.scheduler.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks and not kv.req_to_blocks
    assert not core.scheduler.requests and not core.has_unfinished_requests()


def test_the_runner_declares_async_and_the_engine_plans_one_step_ahead() -> None:
    core, runner = make_engine()
    assert core.async_scheduling and core.scheduler.async_scheduling
    core.add_request("a", prompt_of(20), SamplingParams(max_tokens=6, ignore_eos=True))
    done = core.run_until_done()
    check(core, done, {"a": prompt_of(20)})
    assert runner.max_ahead == 2  # step N+1 launched while step N was not yet collected
    # Decode steps were scheduled while the previous token was unknown: one token each.
    decode_steps = [so for so in runner.scheduled if so.num_scheduled_tokens.get("a") == 1]
    assert len(decode_steps) >= 5


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_are_exact_without_overshoot(max_tokens: int) -> None:
    core, runner = make_engine()
    core.add_request("a", prompt_of(5), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    (req,) = core.run_until_done()
    assert len(req.output_token_ids) == max_tokens
    # The scheduler never plans past max_tokens: the last in-flight token ends the request.
    assert runner.num_steps == max_tokens


def test_stop_token_in_flight_finishes_and_the_extra_step_is_discarded() -> None:
    prompt = prompt_of(9)
    third = reference_generate(
        prompt, SamplingParams(max_tokens=3, ignore_eos=True), set(), VOCAB, 256
    )[0][2]
    core, runner = make_engine()
    core.add_request(
        "a", prompt, SamplingParams(max_tokens=50, stop_token_ids=[third], ignore_eos=True)
    )
    (req,) = core.run_until_done()
    assert req.output_token_ids[-1] == third and len(req.output_token_ids) == 3
    computed = [so for so in runner.scheduled if "a" in so.num_scheduled_tokens]
    assert len(computed) == 4  # one step ran for it after the stop: its token was dropped
    assert runner.scheduled[-1].finished_req_ids == {"a"} and "a" not in runner.states


def test_max_model_len_caps_generation() -> None:
    core, _ = make_engine(max_model_len=20)
    core.add_request("a", prompt_of(18), SamplingParams(max_tokens=10, ignore_eos=True))
    (req,) = core.run_until_done()
    assert len(req.output_token_ids) == 2 and req.status.finish_reason == "length"


PREEMPTION = [
    (6, 16, 4, [30, 30, 30, 30], 40),
    (5, 4, 3, [3, 9, 5], 10),
    (10, 8, 8, [20, 12, 1, 7, 30, 2, 9, 15], 25),
]


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "max_num_seqs", "lengths", "max_tokens"), PREEMPTION
)
def test_preemption_with_a_token_in_flight(
    num_blocks: int, block_size: int, max_num_seqs: int, lengths: list[int], max_tokens: int
) -> None:
    prompts = {f"r{i}": prompt_of(n, i) for i, n in enumerate(lengths)}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=2, logprobs=1)
    core, _ = make_engine(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=32,
    )
    for req_id, prompt in prompts.items():
        core.add_request(req_id, prompt, params)
    done = core.run_until_done()
    assert sum(r.num_preemptions for r in done) > 0
    check(core, done, prompts)
    for req in done:
        assert req.num_prompt_logprobs == len(prompts[req.req_id]) - 1
        assert sum(len(c) for c in req.logprobs) == len(req.output_token_ids)


def test_a_step_that_only_preempts_still_reaches_the_runner() -> None:
    # The oldest running request preempts itself last when even it does not fit: that step
    # schedules nothing, but the runner must still see the preemption (runner_v2 frees the
    # row there and re-adds the request when it resumes; a lost one left a stale row and the
    # resume failed with KeyError).
    prompts = {f"r{i}": prompt_of(n, i) for i, n in enumerate([22, 13, 17, 9])}
    core, runner = make_engine(
        num_blocks=8, block_size=4, max_num_batched_tokens=8, enable_prefix_caching=False
    )
    for req_id, prompt in prompts.items():
        core.add_request(req_id, prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    done = core.run_until_done()
    check(core, done, prompts)
    assert any(so.is_empty and so.preempted_req_ids for so in runner.scheduled)
    seen: set[str] = set()
    for so in runner.scheduled:
        seen |= so.preempted_req_ids
        cached = so.scheduled_cached_reqs
        for req_id, resumed in zip(cached.req_ids, cached.resumed_from_preemption, strict=True):
            if resumed:
                assert req_id in seen, f"{req_id} resumed from a preemption the runner never saw"
                seen.remove(req_id)


def test_a_reused_id_never_receives_the_old_requests_token() -> None:
    # "a" stops at step N (known only when N is applied) while step N+1 already computes it;
    # a new "a" added in between must not receive that step's token.
    prompt = prompt_of(9)
    first = reference_generate(
        prompt, SamplingParams(max_tokens=1, ignore_eos=True), set(), VOCAB, 256
    )[0][0]
    core, _ = make_engine()
    core.add_request(
        "a", prompt, SamplingParams(max_tokens=20, stop_token_ids=[first], ignore_eos=True)
    )
    done: list[Request] = []
    while not done:
        done += core.step()
    assert core._in_flight is not None  # the discarded step is still in flight
    other = prompt_of(4, 3)
    core.add_request("a", other, SamplingParams(max_tokens=5, ignore_eos=True))
    second = core.run_until_done()
    assert done[0].output_token_ids == [first]
    check(core, second, {"a": other})


def test_a_thousand_random_requests() -> None:
    rng = random.Random(4321)
    core, runner = make_engine(
        num_blocks=40, block_size=4, max_num_seqs=12, max_num_batched_tokens=48, max_model_len=96
    )
    done, prompts = drive_random_requests(core, rng, prompt_of(24, 99), VOCAB)
    check(core, done, prompts)
    assert sum(r.num_preemptions for r in done) > 0
    assert runner.max_ahead == 2
