"""Scheduling drafts the runner proposes on the device (runner_v2's ``ngram_gpu`` and
``draft_model``): the scheduler sees neither the drafts nor, until one step later, how many
were accepted.

The device-draft replay runner keeps what runner_v2 keeps on the device: each request's tokens
and its computed count, advanced by the tokens each verification accepts. The scheduler reserves
``1 + k`` positions per decode as if every draft were accepted; the runner writes each scheduled
token's KV at its real position (which must lie in a reserved block), so a wrong count, a
rejected draft's slot not taken back, or a block not reserved changes the output or trips an
assertion. Outputs must be the reference's, synchronous or asynchronous, through preemption,
prefix caching, chunked prefill, stop tokens and the length caps.
"""

from __future__ import annotations

import random

import pytest
from replay_runner import (
    ReplayRunner,
    _State,
    drive_random_requests,
    next_token,
    reference_generate,
)
from test_async_scheduling import EOS, VOCAB, _Pending, check, prompt_of

from turnout.engine.config import EngineConfig, SpeculativeConfig
from turnout.engine.core import EngineCore
from turnout.engine.outputs import ModelRunnerOutput
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput


class DeviceDraftRunner(ReplayRunner):
    """Drafts proposed and verified on the runner's side; the scheduler gets placeholders.

    A draft is the true continuation except where ``wrong(position)`` says otherwise, so the
    number accepted per step varies.
    """

    drafts_on_device = True

    def __init__(self, config: EngineConfig, *, asynchronous: bool, wrong_every: int = 3) -> None:
        super().__init__(config)
        self.async_scheduling = asynchronous
        self.wrong_every = wrong_every
        self.computed: dict[str, int] = {}  # the device's num_computed_tokens
        self.num_verified = self.num_accepted = self.num_collected = 0

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | _Pending:  # type: ignore[override]
        for req_id in so.finished_req_ids:
            self.states.pop(req_id, None)
        self._bind_device(so)
        out = ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        for req_id, num in so.num_scheduled_tokens.items():
            drafts = so.scheduled_spec_decode_tokens.get(req_id, [])
            assert all(d == -1 for d in drafts)  # placeholders: the ids stay on the device
            out.req_ids.append(req_id)
            out.sampled_token_ids.append(self._step(req_id, num, len(drafts)))
        self.num_steps += int(not so.is_empty)
        return _Pending(out, self) if self.async_scheduling else out

    def _bind_device(self, so: SchedulerOutput) -> None:
        for new in so.scheduled_new_reqs:
            self.states[new.req_id] = _State(
                list(new.prompt_token_ids),
                len(new.prompt_token_ids),
                list(new.block_ids),
                new.sampling_params,
            )
            self.computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.states[req_id]
            if cached.resumed_from_preemption[i]:  # recomputed from its full token list
                state.tokens = list(cached.resumed_req_token_ids[i] or [])
                state.block_ids = list(cached.new_block_ids[i] or [])
                self.computed[req_id] = cached.num_computed_tokens[i]
                continue
            state.block_ids.extend(cached.new_block_ids[i] or [])
            # The scheduler counts every draft in flight as accepted: never behind the device.
            assert cached.num_computed_tokens[i] >= self.computed[req_id], req_id
            assert cached.num_output_tokens[i] >= len(state.tokens) - state.num_prompt, req_id

    def _step(self, req_id: str, num: int, num_spec: int) -> list[int]:
        state = self.states[req_id]
        start = self.computed[req_id]
        if start + num - num_spec < len(state.tokens):  # a partial prefill
            assert num_spec == 0
            self._write_device(state, start, state.tokens[start : start + num])
            self.computed[req_id] = start + num
            return []
        assert start + num - num_spec == len(state.tokens), (
            f"{req_id}: the scheduled range is not the device's"
        )
        drafts = self._drafts(state, num_spec)
        self._write_device(state, start, (state.tokens + drafts)[start : start + num])
        produced = self._verify(state, drafts)
        self.num_verified += num_spec
        self.num_accepted += len(produced) - 1
        state.tokens.extend(produced)
        self.computed[req_id] = start + num - (num_spec - (len(produced) - 1))
        return produced

    def _write_device(self, state: _State, start: int, tokens: list[int]) -> None:
        bs = self.config.block_size
        assert state.params is not None
        # No draft past max_tokens or max_model_len: the KV holds at most every token but the
        # last one sampled (EngineCore's capacity check relies on it).
        limit = max(
            state.num_prompt,
            min(state.num_prompt + state.params.max_tokens, self.config.max_model_len) - 1,
        )
        for j, tok in enumerate(tokens):
            pos = start + j
            assert pos < limit, f"position {pos} is past what the request can need ({limit})"
            assert pos // bs < len(state.block_ids), f"position {pos} has no reserved block"
            self.kv[self._slot(state, pos)] = (tok, pos)

    def _drafts(self, state: _State, k: int) -> list[int]:
        chain = list(state.tokens)
        for _ in range(k):
            tok = next_token(chain, VOCAB)
            if (len(chain) * 7 + state.num_prompt) % self.wrong_every == 0:
                tok = (tok + 1) % VOCAB
            chain.append(tok)
        return chain[len(state.tokens) :]


def make_engine(
    *,
    asynchronous: bool = True,
    k: int = 3,
    num_blocks: int = 64,
    wrong_every: int = 3,
    **kwargs: object,
) -> tuple[EngineCore, DeviceDraftRunner]:
    kwargs.setdefault("max_model_len", 256)
    spec = SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=k)
    config = EngineConfig(
        model="replay", vocab_size=VOCAB, eos_token_ids=(EOS,), speculative_config=spec, **kwargs
    )  # type: ignore[arg-type]
    runner = DeviceDraftRunner(config, asynchronous=asynchronous, wrong_every=wrong_every)
    runner.initialize_kv_cache(num_blocks)
    core = EngineCore(config, runner, num_blocks)
    assert core.scheduler.num_device_drafts == k and core.async_scheduling == asynchronous
    return core, runner


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_outputs_are_the_reference_and_drafts_are_counted(asynchronous: bool, k: int) -> None:
    core, runner = make_engine(asynchronous=asynchronous, k=k)
    prompts = {f"r{i}": prompt_of(n, i) for i, n in enumerate([5, 17, 40])}
    for req_id, prompt in prompts.items():
        core.add_request(req_id, prompt, SamplingParams(max_tokens=23, ignore_eos=True))
    done = core.run_until_done()
    check(core, done, prompts)
    stats = core.spec_decode_stats
    assert stats.num_draft_tokens == runner.num_verified > 0
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # some drafts were wrong
    assert sum(r.spec_decode.num_accepted_tokens for r in done) <= stats.num_accepted_tokens
    # Fewer steps than tokens: accepted drafts gave several tokens a step.
    assert runner.num_steps < sum(len(r.output_token_ids) for r in done) + len(prompts)


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("max_tokens", [1, 2, 4, 9])
def test_max_tokens_and_max_model_len_are_exact(asynchronous: bool, max_tokens: int) -> None:
    core, _ = make_engine(
        asynchronous=asynchronous, k=3, wrong_every=1000
    )  # drafts (almost) always right
    core.add_request("a", prompt_of(5), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    (req,) = core.run_until_done()
    assert len(req.output_token_ids) == max_tokens
    core, _runner = make_engine(asynchronous=asynchronous, k=3, max_model_len=24, wrong_every=1000)
    core.add_request("b", prompt_of(18), SamplingParams(max_tokens=100, ignore_eos=True))
    (req,) = core.run_until_done()
    assert len(req.output_token_ids) == 6 and req.status.finish_reason == "length"


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_stop_token_among_accepted_drafts_ends_the_request_there(asynchronous: bool) -> None:
    prompt = prompt_of(9)
    fourth = reference_generate(
        prompt, SamplingParams(max_tokens=4, ignore_eos=True), set(), VOCAB, 256
    )[0][3]
    core, _runner = make_engine(asynchronous=asynchronous, k=5, wrong_every=1000)
    core.add_request(
        "a", prompt, SamplingParams(max_tokens=50, stop_token_ids=[fourth], ignore_eos=True)
    )
    (req,) = core.run_until_done()
    assert req.output_token_ids[-1] == fourth and len(req.output_token_ids) == 4


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_thousand_random_requests_through_preemption_and_prefix_hits(asynchronous: bool) -> None:
    rng = random.Random(99)
    core, _runner = make_engine(
        asynchronous=asynchronous,
        k=3,
        num_blocks=40,
        block_size=4,
        max_num_seqs=12,
        max_num_batched_tokens=48,
        max_model_len=96,
    )
    done, prompts = drive_random_requests(core, rng, prompt_of(24, 99), VOCAB, num_requests=400)
    check(core, done, prompts)
    assert sum(r.num_preemptions for r in done) > 0
    assert core.spec_decode_stats.num_accepted_tokens > 0
    assert core.scheduler.kv_cache_manager.prefix_cache_stats.num_hit_tokens > 0
