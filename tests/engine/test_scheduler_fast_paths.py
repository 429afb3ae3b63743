"""The scheduler's host fast paths give what the general paths give: ``allocate_slots``' early
return (the last block has room) against the full allocation over a seeded random workload, the
request counts kept as ints against the lengths of the token lists through preemption and
resume, and ``CachedRequestData.extend_running`` against ``append``."""

from __future__ import annotations

import random

import pytest
from replay_runner import ReplayRunner
from test_device_drafts import DeviceDraftRunner

from turnout.engine.block_pool import KVCacheBlock
from turnout.engine.config import EngineConfig, SpeculativeConfig
from turnout.engine.core import EngineCore
from turnout.engine.kv_cache_manager import KVCacheManager
from turnout.engine.request import Request
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import CachedRequestData

VOCAB = 97


class SlowPathManager(KVCacheManager):
    """Every allocation through the general path (what allocate_slots did before its fast path)."""

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        blocks = self.req_to_blocks.get(request.req_id) or []
        return self._allocate_new_blocks(request, num_new_tokens, new_computed_blocks or [], blocks)


def _state(kv: KVCacheManager, req_ids: list[str]) -> tuple[object, ...]:
    pool = kv.block_pool
    return (
        {r: kv.get_block_ids(r) for r in req_ids},
        kv.num_free_blocks,
        dict(kv._num_cached_blocks),
        sorted((h, b.block_id) for h, b in pool._cached.items()),
        [b.ref_cnt for b in pool.blocks],
        list(pool._free),
    )


def _ids(blocks: list[KVCacheBlock] | None) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


class _Pair:
    """One request as two identical objects, one per manager (the KV manager fills block_hashes)."""

    def __init__(self, req_id: str, prompt: list[int], arrival: int) -> None:
        self.fast = Request(req_id, prompt, SamplingParams(max_tokens=64), arrival)
        self.slow = Request(req_id, prompt, SamplingParams(max_tokens=64), arrival)

    def set_computed(self, n: int) -> None:
        self.fast.num_computed_tokens = self.slow.num_computed_tokens = n

    def advance(self, num_new: int, num_drafts: int, rng: random.Random) -> None:
        """A step of ``num_new`` tokens ran; one reaching the last known token samples one, plus
        some of its drafts accepted."""
        req = self.fast
        if req.num_computed_tokens + num_new < req.num_tokens:
            self.set_computed(req.num_computed_tokens + num_new)
            return
        for _ in range(1 + rng.randrange(num_drafts + 1)):
            token = rng.randrange(1, VOCAB)
            self.fast.append_output_token(token)
            self.slow.append_output_token(token)
        self.set_computed(req.num_tokens - 1)


@pytest.mark.parametrize("enable_caching", [False, True])
@pytest.mark.parametrize("block_size", [4, 16])
def test_allocate_slots_fast_path_gives_the_slow_paths_block_tables(
    enable_caching: bool, block_size: int
) -> None:
    rng = random.Random(7 + block_size + enable_caching)
    fast = KVCacheManager(96, block_size, enable_caching)
    slow = SlowPathManager(96, block_size, enable_caching)
    num_slow_calls = 0
    general = fast._allocate_new_blocks

    def counted(*args: object) -> list[KVCacheBlock] | None:
        nonlocal num_slow_calls
        num_slow_calls += 1
        return general(*args)  # type: ignore[arg-type]

    fast._allocate_new_blocks = counted  # type: ignore[method-assign]
    prefix = [rng.randrange(1, VOCAB) for _ in range(3 * block_size)]
    live: dict[str, _Pair] = {}
    num_allocations = 0
    for step in range(3000):
        if (not live or rng.random() < 0.04) and len(live) < 10:
            prompt = prefix[: rng.randrange(len(prefix))] + [
                rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 40))
            ]
            pair = _Pair(f"r{step}", prompt, step)
            (hits_f, n_f), (hits_s, n_s) = (
                fast.get_computed_blocks(pair.fast),
                slow.get_computed_blocks(pair.slow),
            )
            assert (_ids(hits_f), n_f) == (_ids(hits_s), n_s)
            num_new = rng.randrange(1, pair.fast.num_tokens - n_f + 1)
            got_f, got_s = (
                fast.allocate_slots(pair.fast, num_new, hits_f),
                slow.allocate_slots(pair.slow, num_new, hits_s),
            )
            assert _ids(got_f) == _ids(got_s)
            if got_f is not None:
                pair.set_computed(n_f)
                pair.advance(num_new, 0, rng)
                live[pair.fast.req_id] = pair
        elif rng.random() < 0.03 or fast.num_free_blocks < 2:
            victim = live.pop(rng.choice(sorted(live)))
            fast.free(victim.fast)
            slow.free(victim.slow)
        else:
            pair = live[rng.choice(sorted(live))]
            req = pair.fast
            remaining = req.num_tokens - req.num_computed_tokens
            drafts = rng.randrange(3) if remaining == 1 else 0
            num_new = drafts + (1 if remaining == 1 else rng.randrange(1, remaining + 1))
            got_f, got_s = (
                fast.allocate_slots(pair.fast, num_new),
                slow.allocate_slots(pair.slow, num_new),
            )
            assert _ids(got_f) == _ids(got_s)
            num_allocations += 1
            if got_f is not None:
                pair.advance(num_new, drafts, rng)
        assert _state(fast, sorted(live)) == _state(slow, sorted(live)), f"step {step}"
    assert (
        num_allocations > 1000 and num_slow_calls < num_allocations / 2
    )  # the fast path was taken


def _check_counts(request: Request) -> None:
    assert request.num_tokens == len(request.all_token_ids)
    assert request.num_output_tokens == len(request.output_token_ids)
    assert request.num_prompt_tokens == len(request.prompt_token_ids)
    assert request.all_token_ids == request.prompt_token_ids + request.output_token_ids


# (asynchronous scheduling, drafts): none, from the runner's output (runner_v1, synchronous)
# or proposed on the device (runner_v2).
LOOPS = [(False, "none"), (True, "none"), (False, "host"), (False, "device"), (True, "device")]


@pytest.mark.parametrize(("async_scheduling", "drafts"), LOOPS)
def test_cached_counts_stay_the_list_lengths_through_preemption_and_resume(
    async_scheduling: bool, drafts: str
) -> None:
    config = EngineConfig(
        model="replay",
        vocab_size=VOCAB,
        eos_token_ids=(0,),
        max_model_len=128,
        block_size=4,
        max_num_seqs=6,
        max_num_batched_tokens=24,
        speculative_config=None
        if drafts == "none"
        else SpeculativeConfig(num_speculative_tokens=2),
    )
    if drafts == "device":
        runner: ReplayRunner = DeviceDraftRunner(config, asynchronous=async_scheduling)
    else:
        runner = ReplayRunner(config, "mixed" if drafts == "host" else "none")
    runner.initialize_kv_cache(14)
    core = EngineCore(config, runner, 14, async_scheduling=async_scheduling)
    rng = random.Random(11)
    for i in range(12):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 20))]
        core.add_request(
            f"r{i}", prompt, SamplingParams(max_tokens=rng.randrange(1, 25), ignore_eos=True)
        )
    done: list[Request] = []
    while core.has_unfinished_requests():
        done += core.step()
        for request in core.scheduler.requests.values():
            _check_counts(request)
    for request in done:
        _check_counts(request)
        assert request.num_output_tokens == request.max_tokens == request.sampling_params.max_tokens  # type: ignore[union-attr]
    assert len(done) == 12 and sum(r.num_preemptions for r in done) > 0


def test_extend_running_appends_what_append_would() -> None:
    by_append, by_extend = CachedRequestData(), CachedRequestData()
    by_append.append(
        "p",
        resumed=True,
        token_ids=[1, 2],
        new_block_ids=[3],
        num_computed_tokens=0,
        num_output_tokens=1,
    )
    by_extend.append(
        "p",
        resumed=True,
        token_ids=[1, 2],
        new_block_ids=[3],
        num_computed_tokens=0,
        num_output_tokens=1,
    )
    rows = [("a", [4, 5], 7, 2), ("b", None, 9, 3)]
    for req_id, ids, computed, outputs in rows:
        by_append.append(
            req_id,
            resumed=False,
            token_ids=None,
            new_block_ids=ids,
            num_computed_tokens=computed,
            num_output_tokens=outputs,
        )
    by_extend.extend_running(*(list(col) for col in zip(*rows, strict=True)))  # type: ignore[arg-type]
    assert by_extend == by_append
