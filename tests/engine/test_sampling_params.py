"""SamplingParams: every field validated with a message that names it."""

from __future__ import annotations

import math

import pytest

from turnout.engine.errors import InvalidRequestError
from turnout.engine.sampling_params import SamplingParams

BAD = [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": "1"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.01}, "min_p"),
    ({"min_p": math.nan}, "min_p"),
    ({"min_p": "0.1"}, "min_p"),
    ({"min_p": True}, "min_p"),
    ({"top_k": 1.5}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"logprobs": -1}, "logprobs"),
    ({"prompt_logprobs": -3}, "prompt_logprobs"),
    ({"seed": 2**63}, "seed"),
    ({"seed": 1.0}, "seed"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": "abc"}, "stop_token_ids"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"logits_processors": [42]}, "logits_processors"),
    # Runners keep these in int32 / float32 tables: a value that does not fit would crash the
    # step of the whole batch (int overflow) or change meaning (inf, 0) on one runner only.
    ({"top_k": 2**31}, "top_k"),
    ({"min_tokens": 2**31, "max_tokens": 2**40}, "min_tokens"),
    ({"temperature": 1e39}, "temperature"),
    ({"top_p": 1e-39}, "top_p"),
    ({"min_p": 1e-39}, "min_p"),  # float32 would hold it as a subnormal, or 0 (disabled)
    ({"repetition_penalty": 1e-39}, "repetition_penalty"),
    ({"repetition_penalty": 1e39}, "repetition_penalty"),
]


@pytest.mark.parametrize(("kwargs", "field"), BAD, ids=[f"{k}" for k, _ in BAD])
def test_bad_values_are_refused_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidRequestError, match=rf"SamplingParams\.{field}="):
        SamplingParams(**kwargs)


GOOD = [
    {},
    {"temperature": 0.0},
    {"temperature": 2, "top_p": 1, "top_k": 0},
    {"top_k": -1, "top_p": 1e-6},
    {"min_p": 0.0},
    {"min_p": 0.05, "top_k": 5, "top_p": 0.9},
    {"min_p": 1, "temperature": 0.7},
    {"presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 1.3},
    {"seed": -(2**63), "min_tokens": 3, "max_tokens": 3},
    {"logprobs": 0, "prompt_logprobs": 0},
    {"stop_token_ids": [5, 7], "ignore_eos": True},
    {"logits_processors": [lambda out, logits: logits]},
    {"top_k": 2**31 - 1, "min_tokens": 2**31 - 1, "max_tokens": 2**40},
    {"temperature": 3e38, "top_p": 1.2e-38, "repetition_penalty": 1.2e-38},
    {"temperature": 1e-300},  # below 1e-5: greedy, never divided by
]


@pytest.mark.parametrize("kwargs", GOOD)
def test_good_values_are_kept(kwargs: dict) -> None:
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        got = getattr(params, name)
        assert got == (tuple(value) if isinstance(value, list) else value)


def test_greedy_and_penalty_flags() -> None:
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=9e-6).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    assert not SamplingParams().has_penalties
    assert SamplingParams(repetition_penalty=1.1).has_penalties


def test_verify_against_engine_limits() -> None:
    SamplingParams(logprobs=20, prompt_logprobs=20).verify(max_logprobs=20, vocab_size=100)
    with pytest.raises(
        InvalidRequestError, match=r"logprobs=21 is above the engine's max_logprobs=20"
    ):
        SamplingParams(logprobs=21).verify(max_logprobs=20, vocab_size=100)
    with pytest.raises(InvalidRequestError, match=r"prompt_logprobs=5 is above .*max_logprobs=4"):
        SamplingParams(prompt_logprobs=5).verify(max_logprobs=4, vocab_size=100)
    with pytest.raises(
        InvalidRequestError, match=r"stop_token_ids \[100\] are outside the vocabulary"
    ):
        SamplingParams(stop_token_ids=[3, 100]).verify(max_logprobs=4, vocab_size=100)
    # max_logprobs may exceed a small vocabulary: k is still bounded by it.
    SamplingParams(logprobs=100, prompt_logprobs=100).verify(max_logprobs=1000, vocab_size=100)
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(
            InvalidRequestError, match=rf"{name}=101 is above the vocabulary size 100"
        ):
            SamplingParams(**{name: 101}).verify(max_logprobs=1000, vocab_size=100)


def test_with_seed_copies() -> None:
    params = SamplingParams(temperature=0.7)
    seeded = params.with_seed(123)
    assert seeded.seed == 123 and params.seed is None and seeded.temperature == 0.7
    assert SamplingParams(logits_processors=[len]).describe()["logits_processors"] == ["len"]
