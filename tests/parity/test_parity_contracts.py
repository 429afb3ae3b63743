"""docs/architecture.md §5.5 contracts, for every runner: seeded sampling independent of batching,
chunking and preemption; prompt logprobs exactly once per prompt token through chunked prefill and
preemption; a reused row carries nothing over; full-vocabulary logprobs within a bounded working
set; a bad request rejected alone; options honoured or refused with a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import WIDE_LLAMA, make_engine, prompts_for, run
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from turnout.engine.errors import EngineConfigError, InvalidRequestError, UnsupportedOptionError
from turnout.engine.request import RequestStatus
from turnout.engine.sampling_params import SamplingParams

VOCAB = 160


def test_seeded_samples_do_not_depend_on_batching_chunking_or_preemption(
    runner_name: str, model_dirs: dict
) -> None:
    path = model_dirs["llama"]
    prompts = prompts_for(VOCAB, [9, 30, 17, 25], seed=3)
    params = [
        SamplingParams(max_tokens=14, temperature=t, top_p=0.95, seed=100 + i, ignore_eos=True)
        for i, t in enumerate([0.7, 1.0, 1.3, 0.9])
    ]
    alone = {}
    for i, prompt in enumerate(prompts):
        core = make_engine(runner_name, path)
        alone[i] = run(core, {"x": (prompt, params[i])})["x"].output_token_ids
    squeezed = make_engine(
        runner_name, path, max_num_batched_tokens=8, block_size=4, num_kv_blocks=24
    )
    done = run(squeezed, {f"r{i}": (p, params[i]) for i, p in enumerate(prompts)})
    assert sum(r.num_preemptions for r in done.values()) > 0
    for i in range(len(prompts)):
        assert done[f"r{i}"].output_token_ids == alone[i]


def test_prefix_cache_hits_do_not_change_outputs(runner_name: str, model_dirs: dict) -> None:
    path = model_dirs["llama"]
    system = prompts_for(VOCAB, [37], seed=12)[0]
    tails = prompts_for(VOCAB, [1, 5, 16, 20], seed=13)
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True, logprobs=1)
    requests = {f"r{i}": ([*system, *tail], params) for i, tail in enumerate(tails)}
    cached = make_engine(runner_name, path, block_size=4)
    first = run(cached, {"r0": requests["r0"]})  # fills the cache with the shared prefix
    done = {**first, **run(cached, {k: v for k, v in requests.items() if k != "r0"})}
    uncached = run(
        make_engine(runner_name, path, block_size=4, enable_prefix_caching=False), requests
    )
    assert [done[k].num_cached_tokens for k in sorted(done)] == [0, 36, 36, 36]
    for k, req in done.items():
        assert req.output_token_ids == uncached[k].output_token_ids
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in req.logprobs]),
            np.concatenate([c.logprobs for c in uncached[k].logprobs]),
            rtol=1e-5,
            atol=1e-5,
        )


def test_prompt_logprobs_once_per_token_through_chunking_and_preemption(
    runner_name: str, model_dirs: dict
) -> None:
    path = model_dirs["qwen2"]
    prompts = prompts_for(VOCAB, [40, 40, 23], seed=5)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, prompt_logprobs=3)
    plain = run(
        make_engine(runner_name, path), {f"r{i}": (p, params) for i, p in enumerate(prompts)}
    )
    core = make_engine(runner_name, path, max_num_batched_tokens=8, block_size=4, num_kv_blocks=16)
    for i, p in enumerate(prompts):
        core.add_request(f"r{i}", p, params)
    done, preempted_mid_prefill = {}, set()
    while core.has_unfinished_requests():
        done.update({r.req_id: r for r in core.step()})
        for req in core.scheduler.waiting:
            if (
                req.status == RequestStatus.PREEMPTED
                and 0 < req.num_prompt_logprobs < req.num_prompt_tokens - 1
            ):
                preempted_mid_prefill.add(req.req_id)
    assert preempted_mid_prefill, (
        "the set-up must preempt a request after part of its prompt logprobs"
    )
    for i, prompt in enumerate(prompts):
        got, want = done[f"r{i}"], plain[f"r{i}"]
        assert sum(len(c) for c in got.prompt_logprobs) == len(prompt) - 1
        got_ids = np.concatenate([c.token_ids for c in got.prompt_logprobs])
        want_ids = np.concatenate([c.token_ids for c in want.prompt_logprobs])
        assert got_ids[:, 0].tolist() == prompt[1:]
        assert np.array_equal(got_ids, want_ids)
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in got.prompt_logprobs]),
            np.concatenate([c.logprobs for c in want.prompt_logprobs]),
            rtol=1e-5,
            atol=1e-5,
        )  # fp32: chunking changes the order of sums, not the values beyond ~1e-6 relative
        assert got.output_token_ids == want.output_token_ids


@pytest.mark.parametrize("light_sets_options", [True, False])
def test_a_reused_row_carries_nothing_over(
    runner_name: str, model_dirs: dict, light_sets_options: bool
) -> None:
    path = model_dirs["llama-bias-mha"]  # untied: random weights give spread-out draws
    long_prompt, short_prompt = prompts_for(VOCAB, [60, 7], seed=9)
    own = {"repetition_penalty": 1.3} if light_sets_options else {}
    light = SamplingParams(max_tokens=24, temperature=1.5, seed=5, logprobs=1, **own)
    probe = run(make_engine(runner_name, path, eos_token_ids=()), {"p": (short_prompt, light)})[
        "p"
    ].output_token_ids
    # Make every stale field of the heavy request visible in the light one: EOS is a token the
    # light request emits late (a stale min_tokens would hold it back); the heavy stop id one
    # it emits early, inside the light request's own min_tokens when it sets one (a stale stop
    # id would be masked there); top_k=1 would make it greedy; penalties would change draws.
    firsts = [i for i, t in enumerate(probe) if t not in probe[:i]]
    stop_at, eos_at = firsts[1], firsts[-1]
    assert eos_at >= max(stop_at + 2, 10), "premise of the set-up"
    stop, eos = probe[stop_at], probe[eos_at]
    if light_sets_options:
        light = SamplingParams(
            max_tokens=24, min_tokens=stop_at + 1, temperature=1.5, seed=5, logprobs=1, **own
        )
    heavy = SamplingParams(
        max_tokens=eos_at + 1,
        min_tokens=eos_at + 1,
        temperature=0.0,
        top_k=1,
        top_p=0.5,
        presence_penalty=2.0,
        frequency_penalty=2.0,
        repetition_penalty=0.5,
        stop_token_ids=[stop],
        logprobs=5,
        prompt_logprobs=3,
    )
    core = make_engine(runner_name, path, max_num_seqs=1, eos_token_ids=(eos,))
    run(core, {"heavy": (long_prompt, heavy)})
    after = run(core, {"light": (short_prompt, light)})["light"]
    fresh = run(
        make_engine(runner_name, path, max_num_seqs=1, eos_token_ids=(eos,)),
        {"light": (short_prompt, light)},
    )["light"]
    assert fresh.output_token_ids == probe[: eos_at + 1] and fresh.status.finish_reason == "stop"
    assert after.output_token_ids == fresh.output_token_ids
    assert after.status.finish_reason == "stop" and after.prompt_logprobs == []
    np.testing.assert_array_equal(
        np.concatenate([c.token_ids for c in after.logprobs]),
        np.concatenate([c.token_ids for c in fresh.logprobs]),
    )
    np.testing.assert_array_equal(
        np.concatenate([c.logprobs for c in after.logprobs]),
        np.concatenate([c.logprobs for c in fresh.logprobs]),
    )


class LargestVocabTensor(TorchDispatchMode):
    """Records the largest tensor spanning the vocabulary (last dimension ``vocab_size`` or
    ``vocab_size + 1``) that any torch op produces while active."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.widths = (vocab_size, vocab_size + 1)
        self.max_numel, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            wide = isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] in self.widths
            if wide and t.numel() > self.max_numel:
                self.max_numel, self.op = t.numel(), str(func)
        return out


def test_full_vocabulary_logprobs_keep_a_bounded_working_set(
    runner_name: str, model_dirs: dict
) -> None:
    vocab = WIDE_LLAMA["vocab_size"]
    prompt = prompts_for(vocab, [1000], seed=1)[0]
    params = SamplingParams(
        max_tokens=3, temperature=0, logprobs=vocab, prompt_logprobs=vocab, ignore_eos=True
    )
    core = make_engine(
        runner_name,
        model_dirs["wide-llama"],
        max_model_len=1024,
        max_logprobs=vocab,
        max_num_batched_tokens=512,
    )
    core.add_request("full", prompt, params)
    tracker = LargestVocabTensor(vocab)
    with tracker:
        (req,) = core.run_until_done()
    # A naive implementation materialises [prompt tokens, vocab] (8.2M elements) at once, or
    # [512, vocab] (4.2M) per chunk; the contract allows 2**20 elements (4 MiB of float32) per
    # vocabulary-wide temporary, whatever the prompt length and k.
    assert tracker.max_numel <= 2**20, f"{tracker.op} made a tensor of {tracker.max_numel} elements"
    lps = np.concatenate([c.logprobs for c in req.prompt_logprobs])
    assert lps.shape == (len(prompt) - 1, vocab + 1)
    np.testing.assert_allclose(np.exp(lps[:, 1:].astype(np.float64)).sum(1), 1.0, atol=1e-3)
    assert (np.diff(lps[:, 1:], axis=1) <= 0).all()  # most likely first
    assert req.logprobs[0].token_ids.shape == (1, vocab + 1)


BAD = [
    (
        "prompt longer than max_model_len",
        list(range(3, 300)),
        SamplingParams(max_tokens=4),
        r"297 tokens, more than max_model_len=256",
    ),
    (
        "logprobs above the maximum",
        [5, 6, 7],
        SamplingParams(logprobs=21),
        r"logprobs=21 is above the engine's max_logprobs=20",
    ),
    (
        "prompt logprobs above the maximum",
        [5, 6, 7],
        SamplingParams(prompt_logprobs=50),
        r"prompt_logprobs=50 is above",
    ),
    ("token outside the vocabulary", [5, VOCAB + 3], SamplingParams(), r"outside the vocabulary"),
]


@pytest.mark.parametrize(("note", "prompt", "params", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_is_rejected_alone(
    runner_name: str,
    model_dirs: dict,
    note: str,
    prompt: list[int],
    params: SamplingParams,
    message: str,
) -> None:
    path = model_dirs["llama"]
    good = prompts_for(VOCAB, [12, 20], seed=2)
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    want = run(make_engine(runner_name, path), {f"g{i}": (p, greedy) for i, p in enumerate(good)})
    core = make_engine(runner_name, path)
    core.add_request("g0", good[0], greedy)
    with pytest.raises(InvalidRequestError, match=message):
        core.add_request("bad", prompt, params)
    core.add_request("g1", good[1], greedy)
    done = {r.req_id: r for r in core.run_until_done()}
    assert {k: r.output_token_ids for k, r in done.items()} == {
        k: r.output_token_ids for k, r in want.items()
    }


def test_a_request_failing_at_run_time_fails_alone(runner_name: str, model_dirs: dict) -> None:
    def boom(out_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("processor bug")

    path = model_dirs["llama"]
    good = prompts_for(VOCAB, [12], seed=2)[0]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    core = make_engine(runner_name, path)
    core.add_request("good", good, greedy)
    try:
        core.add_request("bad", good, SamplingParams(max_tokens=6, logits_processors=[boom]))
    except UnsupportedOptionError as exc:  # a runner without processors refuses them up front
        assert "logits_processors" in str(exc)
    done = {r.req_id: r for r in core.run_until_done()}
    assert (
        done["good"].output_token_ids
        == run(make_engine(runner_name, path), {"x": (good, greedy)})["x"].output_token_ids
    )
    if "bad" in done:
        assert done["bad"].status.finish_reason == "error"
        assert "logits processor boom failed: RuntimeError: processor bug" in done["bad"].error


def test_cpu_offload_is_honoured_or_refused(runner_name: str, model_dirs: dict) -> None:
    path = model_dirs["llama"]
    prompts = prompts_for(VOCAB, [10, 21], seed=4)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    want = run(
        make_engine(runner_name, path), {f"r{i}": (p, greedy) for i, p in enumerate(prompts)}
    )
    try:
        core = make_engine(runner_name, path, cpu_offload_gb=1e-4)  # ~105 kB: one of two layers
    except EngineConfigError as exc:
        assert "cpu_offload_gb" in str(exc)
        return
    done = run(core, {f"r{i}": (p, greedy) for i, p in enumerate(prompts)})
    stats = core.runner.offload_stats  # a runner that accepts the option reports what it did
    assert stats.num_offloaded_layers == 1 and stats.offloaded_bytes >= 1e-4 * 2**30
    assert stats.num_transfers == core.num_steps  # streamed in at every forward
    for k, req in done.items():
        assert req.output_token_ids == want[k].output_token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_ngram_speculation_is_honoured_or_refused(
    runner_name: str, model_dirs: dict, temperature: float
) -> None:
    path = model_dirs["mistral-sliding-window"]
    # Repetitive prompts so that the n-gram proposer finds matches.
    base = prompts_for(VOCAB, [6, 9], seed=8)
    prompts = [b * 4 for b in base]
    params = SamplingParams(
        max_tokens=24, temperature=temperature, seed=21, ignore_eos=True, logprobs=0
    )
    want = run(
        make_engine(runner_name, path), {f"r{i}": (p, params) for i, p in enumerate(prompts)}
    )
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    try:
        core = make_engine(runner_name, path, speculative_config=spec, max_num_batched_tokens=32)
    except EngineConfigError as exc:
        assert "speculative" in str(exc)
        return
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    plain_steps = make_engine(runner_name, path, max_num_batched_tokens=32)
    run(plain_steps, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for k, req in done.items():
        assert req.output_token_ids == want[k].output_token_ids
        got_lp = np.concatenate([c.logprobs[:, 0] for c in req.logprobs])
        np.testing.assert_allclose(
            got_lp, np.concatenate([c.logprobs[:, 0] for c in want[k].logprobs]), atol=1e-5
        )
    if temperature == 0.0:
        assert core.num_steps < plain_steps.num_steps  # drafts were accepted
