"""min_p (docs/sampling.md step 6, vLLM's ``MinPLogitsProcessor``) end to end on every runner:
seeded min-p samples, alone or with top-k, top-p and penalties, are the same tokens on each; min-p
changes the draw; ``min_p=1`` keeps only the most likely token, so a sampled request gives the
greedy tokens."""

from __future__ import annotations

import pytest
from conftest import RUNNERS, make_engine, prompts_for, run

from turnout.engine.request import Request
from turnout.engine.sampling_params import SamplingParams

VOCAB = 160
SEEDED = {
    "min_p": {"temperature": 1.0, "min_p": 0.05},
    "min_p_hot": {"temperature": 2.0, "min_p": 0.3},
    "min_p_top_k": {"temperature": 1.3, "min_p": 0.1, "top_k": 20},
    "min_p_top_p": {"temperature": 1.5, "min_p": 0.2, "top_p": 0.9},
    "min_p_penalties": {"temperature": 1.2, "min_p": 0.15, "repetition_penalty": 1.3},
}


@pytest.fixture(scope="module")
def done(model_dirs: dict) -> dict[str, dict[str, Request]]:
    """Every runner's finished requests: the seeded cases, the hot case without min-p, and each
    prompt greedily and at ``min_p=1`` (temperature 1, seeded)."""
    prompts = prompts_for(VOCAB, [7, 19, 12], seed=21)
    common = {"max_tokens": 10, "ignore_eos": True}
    requests = {
        name: (prompts[i % len(prompts)], SamplingParams(seed=40 + i, **common, **kw))
        for i, (name, kw) in enumerate(SEEDED.items())
    }
    requests["hot_without_min_p"] = (
        requests["min_p_hot"][0],
        SamplingParams(seed=41, temperature=2.0, **common),  # min_p_hot's prompt and seed
    )
    for i, prompt in enumerate(prompts):
        requests[f"greedy{i}"] = (prompt, SamplingParams(temperature=0.0, **common))
        requests[f"min_p_1_{i}"] = (
            prompt,
            SamplingParams(temperature=1.0, min_p=1.0, seed=7 + i, **common),
        )
    return {
        runner: run(make_engine(runner, model_dirs["llama"]), dict(requests)) for runner in RUNNERS
    }


def test_seeded_min_p_samples_are_the_same_tokens_on_every_runner(done: dict) -> None:
    want = done[RUNNERS[0]]
    for runner in RUNNERS[1:]:
        for name in SEEDED:
            assert done[runner][name].output_token_ids == want[name].output_token_ids, (
                runner,
                name,
            )


def test_min_p_changes_the_draw(done: dict) -> None:
    # Same prompt, seed and temperature: at 2.0 min_p 0.3 drops tokens the plain draw picks.
    for runner in RUNNERS:
        with_min_p = done[runner]["min_p_hot"].output_token_ids
        assert with_min_p != done[runner]["hot_without_min_p"].output_token_ids, runner


def test_min_p_1_keeps_only_the_most_likely_token(done: dict) -> None:
    for runner in RUNNERS:
        for i in range(3):
            sampled = done[runner][f"min_p_1_{i}"].output_token_ids
            assert len(sampled) == 10
            assert sampled == done[runner][f"greedy{i}"].output_token_ids, (runner, i)
