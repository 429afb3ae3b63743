"""Hostile and mixed requests on every runner: limits that only show with unusual engine
settings, and a batch in which every row asks for something different, compared across the
runners directly (the reference tests give every row of a batch the same options)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import RUNNERS, make_engine, prompts_for, run

from turnout.engine.errors import InvalidRequestError
from turnout.engine.llm import LLM
from turnout.engine.sampling_params import SamplingParams

VOCAB = 160


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprobs_above_the_vocabulary_are_rejected_alone(
    runner_name: str, model_dirs: dict, field: str
) -> None:
    # max_logprobs above the vocabulary: k = vocab_size + 1 used to reach the runner, where
    # runner_v1 failed the whole step on a [n, 1 + k] result with only vocab_size columns.
    path = model_dirs["llama"]
    good = prompts_for(VOCAB, [9, 14], seed=6)
    full = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, **{field: VOCAB})
    core = make_engine(runner_name, path, max_logprobs=1000)
    core.add_request("full", good[0], full)
    with pytest.raises(
        InvalidRequestError, match=rf"{field}={VOCAB + 1} is above the vocabulary size {VOCAB}"
    ):
        core.add_request("bad", good[1], SamplingParams(max_tokens=3, **{field: VOCAB + 1}))
    core.add_request("plain", good[1], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    done = {r.req_id: r for r in core.run_until_done()}
    assert sorted(done) == ["full", "plain"]
    chunks = done["full"].logprobs if field == "logprobs" else done["full"].prompt_logprobs
    rows = np.concatenate([c.logprobs for c in chunks])
    assert rows.shape == ((3 if field == "logprobs" else len(good[0]) - 1), VOCAB + 1)
    np.testing.assert_allclose(np.exp(rows[:, 1:].astype(np.float64)).sum(1), 1.0, atol=1e-4)


def test_a_pooling_request_to_a_decoder_is_rejected_alone(
    runner_name: str, model_dirs: dict
) -> None:
    # EngineCore.add_request(..., pooling=True) on a generative model reached the runner and
    # failed the step of the whole batch with a bare AssertionError.
    path = model_dirs["llama"]
    prompt = prompts_for(VOCAB, [6], seed=4)[0]
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    core = make_engine(runner_name, path)
    core.add_request("good", prompt, greedy)
    with pytest.raises(
        InvalidRequestError, match=r"request 'embed': .*generates text: it serves no pooling"
    ):
        core.add_request("embed", prompt, pooling=True)
    (done,) = core.run_until_done()
    assert done.req_id == "good" and len(done.output_token_ids) == 3


def _mixed_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_tokens=rng.randint(1, 10),
        min_tokens=rng.choice([0, 0, 1, 2]),
        temperature=rng.choice([0.0, 0.5, 1.0, 1.7]),
        top_p=rng.choice([1.0, 0.9, 0.3, 1.2e-38]),
        top_k=rng.choice([-1, 0, 1, 3, 50, 2**31 - 1]),
        presence_penalty=rng.choice([0.0, 1.0, -1.5]),
        frequency_penalty=rng.choice([0.0, 0.5]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.7]),
        seed=rng.randint(-(2**63), 2**63 - 1),
        stop_token_ids=rng.sample(range(VOCAB), rng.choice([0, 3])),
        ignore_eos=rng.random() < 0.5,
        logprobs=rng.choice([None, 0, 3]),
        prompt_logprobs=rng.choice([None, 2]),
    )


def test_a_batch_of_mixed_options_gives_the_same_tokens_on_every_runner(model_dirs: dict) -> None:
    # Every row with its own temperature, top-k (up to 2**31 - 1), top-p (down to float32's
    # smallest normal), penalties, min_tokens, stop ids and seed; once with room, once squeezed
    # (chunked prefill, preemption, one row at a time reused). Every run must agree.
    rng = random.Random(2026)
    requests = {}
    for i in range(10):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
        requests[f"r{i}"] = (prompt, _mixed_params(rng))
    layouts = {
        "roomy": {},
        "squeezed": {
            "max_num_batched_tokens": 8,
            "block_size": 4,
            "num_kv_blocks": 16,
            "max_num_seqs": 3,
        },
    }
    results, logprobs = {}, {}
    for runner in RUNNERS:
        for layout, kwargs in layouts.items():
            done = run(
                make_engine(runner, model_dirs["llama"], eos_token_ids=(2, 5), **kwargs),
                dict(requests),
            )
            results[runner, layout] = {
                k: (r.output_token_ids, r.status.finish_reason) for k, r in done.items()
            }
            logprobs[runner, layout] = {
                k: (_joined(r.logprobs), _joined(r.prompt_logprobs)) for k, r in done.items()
            }
    want = results[RUNNERS[0], "roomy"]
    assert len({tuple(t) for t, _ in want.values()}) > 5, "premise: the rows differ"
    for key, got in results.items():
        assert got == want, f"{key} differs from {RUNNERS[0]}/roomy"
    # Logprobs too: the same top-k ids (ties to the lower id) and ranks, values within fp32 noise.
    want_lps = logprobs[RUNNERS[0], "roomy"]
    assert sum(len(s[0][0]) + len(s[1][0]) for s in want_lps.values()) > 20, (
        "premise: logprobs were asked"
    )
    for key, got_lps in logprobs.items():
        for k, sides in got_lps.items():
            for (ids, lps, ranks), (want_ids, want_values, want_ranks) in zip(
                sides, want_lps[k], strict=True
            ):
                assert np.array_equal(ids, want_ids) and np.array_equal(ranks, want_ranks), (key, k)
                np.testing.assert_allclose(
                    lps, want_values, atol=1e-5, rtol=0, err_msg=f"{key} {k}"
                )


def _joined(chunks: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not chunks:
        return np.zeros((0, 0), np.int32), np.zeros((0, 0), np.float32), np.zeros(0, np.int32)
    return tuple(
        np.concatenate([getattr(c, f) for c in chunks]) for f in ("token_ids", "logprobs", "ranks")
    )  # type: ignore[return-value]


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt (not caught as an Exception by anything on the way)."""


def test_an_interrupted_generate_leaves_the_llm_usable(runner_name: str, model_dirs: dict) -> None:
    # A generate call stopped part-way (Ctrl-C, or an exception out of the runner) left its
    # requests running with tokens the engine had scheduled but never received: the next call
    # failed ("no progress" on runner_v1, "out of step" on runner_v2). And the blocks of the
    # step that never ran were already in the prefix cache, holding no KV.
    prompt = prompts_for(VOCAB, [40], seed=21)[0]
    other = prompts_for(VOCAB, [7], seed=22)[0]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    kwargs = {"device": "cpu", "max_model_len": 128, "block_size": 4, "environ": {}}
    llm = LLM(model_dirs["llama"], runner_name, **kwargs)
    launch = llm.core.runner.execute_model
    for fail_at in (1, 3):  # before the prompt's KV is written; then mid-decode
        calls = []

        def execute_model(so, calls=calls, fail_at=fail_at):
            calls.append(so)
            if len(calls) == fail_at:
                raise Interrupted
            return launch(so)

        llm.core.runner.execute_model = execute_model
        with pytest.raises(Interrupted):
            llm.generate([prompt, other], greedy)
        llm.core.runner.execute_model = launch
        assert not llm.core.has_unfinished_requests()
        again = llm.generate([prompt, other], greedy)
        fresh = LLM(model_dirs["llama"], runner_name, **kwargs).generate([prompt, other], greedy)
        assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in fresh]
        kv = llm.core.scheduler.kv_cache_manager
        assert kv.num_free_blocks == kv.num_blocks
