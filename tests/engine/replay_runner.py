"""A pure-Python runner for scheduler tests: a paged KV store and a hash "model".

It keeps a real paged KV store (one ``(token_id, position)`` entry per slot), writes each
scheduled token into the slot its block table gives, and computes every next token only from
what it reads back through the block table. A wrong block id, slot, prefix-cache hit, resume or
chunk boundary therefore changes the output or trips an assertion; the expected output of any
request is :func:`reference_generate`, computed without any scheduler.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from turnout.engine.config import EngineConfig
from turnout.engine.core import EngineCore
from turnout.engine.outputs import Logprobs, ModelRunnerOutput, PromptLogprobs
from turnout.engine.request import Request
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput


def next_token(context: list[int], vocab_size: int) -> int:
    """The hash model: the next token after ``context``."""
    h = 1469598103934665603
    for tok in context:
        h = ((h ^ tok) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return (h >> 17) % vocab_size


def fake_logprob(context: list[int], token: int) -> float:
    """A deterministic stand-in for log p(token | context), distinct per (len, token)."""
    return -((len(context) * 31 + token) % 997) / 100.0


def reference_generate(
    prompt: list[int], params: SamplingParams, eos: set[int], vocab_size: int, max_model_len: int
) -> tuple[list[int], str]:
    """What the engine must produce for one request, with no scheduler involved."""
    tokens = list(prompt)
    out: list[int] = []
    while True:
        tok = next_token(tokens, vocab_size)
        tokens.append(tok)
        out.append(tok)
        stops = (not params.ignore_eos and tok in eos) or tok in params.stop_token_ids
        if stops and len(out) >= params.min_tokens:
            return out, "stop"
        if len(out) >= params.max_tokens or len(tokens) >= max_model_len:
            return out, "length"


@dataclass
class _State:
    tokens: list[int]
    num_prompt: int
    block_ids: list[int]
    params: SamplingParams | None


class ReplayRunner:
    """Implements :class:`engine.runner_protocol.ModelRunner` over the hash model.

    Args:
        config: engine configuration (block size, vocab).
        propose: ``"none"``, ``"right"`` (drafts are the true continuation) or ``"mixed"``
            (the first draft right, the second wrong) for speculative scheduling.
    """

    def __init__(self, config: EngineConfig, propose: str = "none") -> None:
        self.config = config
        self.propose = propose
        self.states: dict[str, _State] = {}
        self.kv: list[tuple[int, int] | None] = []
        self.num_steps = 0
        self.max_tokens_in_step = 0
        self.num_kv_writes = 0

    # protocol -------------------------------------------------------------------------
    def load_model(self) -> None:
        pass

    def kv_cache_block_bytes(self) -> int:
        return 16 * self.config.block_size

    def available_kv_cache_bytes(self) -> int:
        return 1 << 20

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv = [None] * (num_blocks * self.config.block_size)

    def check_sampling_params(self, params: SamplingParams) -> None:
        pass

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in so.finished_req_ids:
            self.states.pop(req_id, None)
        to_check = self._bind(so)
        self.num_steps += 1
        self.max_tokens_in_step = max(self.max_tokens_in_step, so.total_num_scheduled_tokens)
        # Like one layer of a forward pass: every scheduled token's KV is written before any
        # attention reads (a request may hit blocks another one fills in this same step).
        for req_id, num in so.num_scheduled_tokens.items():
            self._write(req_id, num, so)
        for req_id, num_computed in to_check.items():
            self._check_computed(req_id, num_computed)
        req_ids, sampled = [], []
        out = ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)
        for req_id, num in so.num_scheduled_tokens.items():
            req_ids.append(req_id)
            sampled.append(self._run(req_id, num, so, out))
        return out

    # internals ------------------------------------------------------------------------
    def _bind(self, so: SchedulerOutput) -> dict[str, int]:
        to_check = {}
        for new in so.scheduled_new_reqs:
            assert new.req_id not in self.states, f"{new.req_id} bound twice"
            self.states[new.req_id] = _State(
                list(new.prompt_token_ids),
                len(new.prompt_token_ids),
                list(new.block_ids),
                new.sampling_params,
            )
            to_check[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.states[req_id]
            if cached.resumed_from_preemption[i]:
                state.tokens = list(cached.resumed_req_token_ids[i] or [])
                state.block_ids = list(cached.new_block_ids[i] or [])
            elif cached.new_block_ids[i]:
                state.block_ids.extend(cached.new_block_ids[i] or [])
            assert len(state.tokens) - state.num_prompt == cached.num_output_tokens[i]
            to_check[req_id] = cached.num_computed_tokens[i]
        return to_check

    def _slot(self, state: _State, pos: int) -> int:
        bs = self.config.block_size
        return state.block_ids[pos // bs] * bs + pos % bs

    def _check_computed(self, req_id: str, num_computed: int) -> None:
        # Prefix-cache hits must hold exactly this request's tokens.
        state = self.states[req_id]
        for pos in range(num_computed):
            assert self.kv[self._slot(state, pos)] == (state.tokens[pos], pos), (
                f"{req_id}: stale KV at {pos}"
            )

    def _context(self, state: _State, end: int) -> list[int]:
        ctx = []
        for pos in range(end):
            entry = self.kv[self._slot(state, pos)]
            assert entry is not None and entry[1] == pos, f"KV slot of position {pos} holds {entry}"
            ctx.append(entry[0])
        return ctx

    def _write(self, req_id: str, num: int, so: SchedulerOutput) -> None:
        state = self.states[req_id]
        if state.params is None:
            return  # pooling: an encoder forward, no KV cache
        start = self._num_computed(so, req_id)
        seq = state.tokens + list(so.scheduled_spec_decode_tokens.get(req_id, []))
        assert start + num <= len(seq), f"{req_id}: scheduled past its known tokens"
        for pos in range(start, start + num):
            self.kv[self._slot(state, pos)] = (seq[pos], pos)
            self.num_kv_writes += 1

    def _run(self, req_id: str, num: int, so: SchedulerOutput, out: ModelRunnerOutput) -> list[int]:
        state = self.states[req_id]
        drafts = so.scheduled_spec_decode_tokens.get(req_id, [])
        start = self._num_computed(so, req_id)
        if state.params is None:  # pooling: the "embedding" is the prompt's mean id
            assert start == 0 and num == len(state.tokens), "pooling runs the whole prompt at once"
            out.pooled_outputs[req_id] = np.asarray([float(np.mean(state.tokens))], np.float32)
            return []
        self._prompt_logprobs(req_id, state, start, num, out)
        if start + num < len(state.tokens):
            return []  # partial prefill
        produced = self._verify(state, drafts)
        state.tokens.extend(produced)
        self._logprobs(req_id, state, produced, out)
        if self.propose != "none":
            out.spec_token_ids[req_id] = self._propose(state)
        return produced

    def _num_computed(self, so: SchedulerOutput, req_id: str) -> int:
        for new in so.scheduled_new_reqs:
            if new.req_id == req_id:
                return new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        return cached.num_computed_tokens[cached.req_ids.index(req_id)]

    def _verify(self, state: _State, drafts: list[int]) -> list[int]:
        base = len(state.tokens)
        produced = []
        for j in range(len(drafts) + 1):
            target = next_token(self._context(state, base) + produced, self.config.vocab_size)
            produced.append(target)
            if j == len(drafts) or drafts[j] != target:
                break
        return produced

    def _propose(self, state: _State) -> list[int]:
        k = self.config.num_speculative_tokens
        chain = list(state.tokens)
        for _ in range(k):
            chain.append(next_token(chain, self.config.vocab_size))
        drafts = chain[len(state.tokens) :]
        if self.propose == "mixed" and k >= 2:
            drafts[1] = (drafts[1] + 1) % self.config.vocab_size
        return drafts

    def _prompt_logprobs(
        self, req_id: str, state: _State, start: int, num: int, out: ModelRunnerOutput
    ) -> None:
        k = state.params.prompt_logprobs if state.params else None
        if k is None:
            return
        # Logits at position p score prompt token p + 1.
        first, last = max(start, 0), min(start + num, state.num_prompt - 1)
        if first >= last:
            return
        rows = [
            self._row(state.tokens[: p + 1], state.tokens[p + 1], k) for p in range(first, last)
        ]
        out.prompt_logprobs[req_id] = PromptLogprobs(first + 1, _stack(rows))

    def _logprobs(
        self, req_id: str, state: _State, produced: list[int], out: ModelRunnerOutput
    ) -> None:
        k = state.params.logprobs if state.params else None
        if k is None:
            return
        base = len(state.tokens) - len(produced)
        rows = [self._row(state.tokens[: base + j], tok, k) for j, tok in enumerate(produced)]
        out.logprobs[req_id] = _stack(rows)

    def _row(self, context: list[int], token: int, k: int) -> tuple[list[int], list[float], int]:
        top = [(t, fake_logprob(context, t)) for t in range(k)]
        return (
            [token, *[t for t, _ in top]],
            [fake_logprob(context, token), *[lp for _, lp in top]],
            1,
        )


def _stack(rows: list[tuple[list[int], list[float], int]]) -> Logprobs:
    return Logprobs(
        np.asarray([r[0] for r in rows], np.int32),
        np.asarray([r[1] for r in rows], np.float32),
        np.asarray([r[2] for r in rows], np.int32),
    )


def drive_random_requests(
    core: EngineCore,
    rng: random.Random,
    common_prefix: list[int],
    vocab_size: int,
    num_requests: int = 1000,
) -> tuple[list[Request], dict[str, list[int]]]:
    """Add ``num_requests`` random requests (shared prefixes, stop ids, min_tokens, prompt
    logprobs, ~10% aborts) between random numbers of steps; run to the end. Returns the
    finished requests and the prompts of those not aborted."""
    prompts: dict[str, list[int]] = {}
    done: list[Request] = []
    for i in range(num_requests):
        tail = [rng.randrange(1, vocab_size) for _ in range(rng.randrange(1, 60))]
        prompt = (common_prefix[: rng.randrange(0, len(common_prefix))] + tail)[:90]
        params = SamplingParams(
            max_tokens=rng.randrange(1, 30),
            min_tokens=rng.choice([0, 0, 1]),
            ignore_eos=rng.random() < 0.5,
            stop_token_ids=rng.choice([[], [rng.randrange(vocab_size)]]),
            prompt_logprobs=rng.choice([None, None, 1]),
        )
        prompts[f"r{i}"] = prompt
        core.add_request(f"r{i}", prompt, params)
        if rng.random() < 0.1:
            victim = f"r{rng.randrange(i + 1)}"
            if core.abort_request(victim) is not None:
                prompts.pop(victim)
        for _ in range(rng.randrange(0, 3)):
            if core.has_unfinished_requests():
                done += core.step()
    done += core.run_until_done()
    return done, prompts
