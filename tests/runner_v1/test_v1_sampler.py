"""runner_v1's sampler against docs/sampling.md, step by step, with hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from turnout.kernels.gumbel_noise import gumbel_noise_ref
from turnout.runner_v1.sampler import (
    SamplingMetadata,
    apply_logits_processors,
    apply_masks,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    sample,
)

NEG_INF = float("-inf")


def md_for(n: int, **kw: object) -> SamplingMetadata:
    base: dict[str, object] = {
        "temperature": torch.ones(n),
        "top_k": torch.full((n,), -1, dtype=torch.int64),
        "top_p": torch.ones(n),
        "seeds": torch.arange(n, dtype=torch.int64),
        "positions": torch.zeros(n, dtype=torch.int64),
        "output_token_ids": [[] for _ in range(n)],
        "prompt_token_ids": [[] for _ in range(n)],
    }
    base.update(kw)
    return SamplingMetadata(**base)  # type: ignore[arg-type]


def test_greedy_ties_go_to_the_lowest_id() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    md = md_for(2, temperature=torch.zeros(2))
    assert sample(logits, md).tolist() == [1, 0]


TOP_K = [
    ([5.0, 4.0, 4.0, 1.0], 1, [True, False, False, False]),
    ([5.0, 4.0, 4.0, 1.0], 2, [True, True, True, False]),  # the tie at the k-th place is kept
    ([5.0, 4.0, 4.0, 1.0], 3, [True, True, True, False]),
    ([5.0, 4.0, 4.0, 1.0], 4, [True, True, True, True]),
    ([5.0, 4.0, 4.0, 1.0], 0, [True, True, True, True]),
    ([5.0, 4.0, 4.0, 1.0], -1, [True, True, True, True]),
    ([5.0, 4.0, 4.0, 1.0], 99, [True, True, True, True]),
]


@pytest.mark.parametrize(("logits", "k", "kept"), TOP_K)
def test_top_k(logits: list[float], k: int, kept: list[bool]) -> None:
    out = apply_top_k_top_p(torch.tensor([logits]), torch.tensor([k]), torch.ones(1))
    assert (out[0] > NEG_INF).tolist() == kept


TOP_P = [
    ([0.5, 0.3, 0.2], 0.8, [True, True, False]),  # 0.5 + 0.3 reaches 0.8
    ([0.5, 0.3, 0.2], 0.81, [True, True, True]),
    ([0.5, 0.3, 0.2], 0.5, [True, False, False]),
    ([0.5, 0.3, 0.2], 0.01, [True, False, False]),  # at least the most likely
    ([0.4, 0.3, 0.3], 0.5, [True, True, True]),  # boundary tie kept
    ([0.2, 0.5, 0.3], 0.7, [False, True, True]),
    ([0.5, 0.3, 0.2], 1.0, [True, True, True]),
]


@pytest.mark.parametrize(("probs", "p", "kept"), TOP_P)
def test_top_p(probs: list[float], p: float, kept: list[bool]) -> None:
    logits = torch.tensor([probs]).log()
    out = apply_top_k_top_p(logits, torch.tensor([-1]), torch.tensor([p]))
    assert (out[0] > NEG_INF).tolist() == kept


def test_top_k_then_top_p_rows_independent() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]).log()
    out = apply_top_k_top_p(logits, torch.tensor([2, -1]), torch.tensor([0.6, 0.6]))
    # row 0: top-2 renormalises to 0.625/0.375, top_p 0.6 keeps the first only
    assert (out > NEG_INF).tolist() == [[True, False, False], [True, True, False]]


def test_penalties_follow_vllm_definitions() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]])
    md = md_for(
        1,
        output_token_ids=[[2, 2, 3]],
        prompt_token_ids=[[0, 1]],
        presence_penalty=torch.tensor([0.5]),
        frequency_penalty=torch.tensor([0.25]),
        repetition_penalty=torch.tensor([2.0]),
    )
    apply_penalties(logits, md)
    # token 0 (prompt, >0): 2/2; token 1 (prompt, <0): -2*2; token 2 (output x2): 1/2 - 0.25*2 - 0.5;
    # token 3 (output x1): 0.5/2 - 0.25 - 0.5; token 4 untouched
    want = [1.0, -4.0, 0.5 - 0.5 - 0.5, 0.25 - 0.25 - 0.5, 3.0]
    torch.testing.assert_close(logits[0], torch.tensor(want))


def test_min_tokens_masks() -> None:
    logits = torch.zeros(2, 6)
    apply_masks(logits, md_for(2, masked_token_ids=[(2, 5), ()]))
    assert logits[0].tolist() == [0, 0, NEG_INF, 0, 0, NEG_INF] and logits[1].tolist() == [0] * 6


def test_seeded_draw_is_gumbel_max_keyed_on_seed_and_position() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen)
    md = md_for(
        3,
        temperature=torch.tensor([0.7, 1.0, 1.3]),
        seeds=torch.tensor([11, 11, 12]),
        positions=torch.tensor([4, 5, 4]),
    )
    got = sample(logits, md)
    noise = gumbel_noise_ref(md.seeds, md.positions, 50)
    want = (logits / md.temperature[:, None] + noise).argmax(-1)
    assert got.tolist() == want.tolist()
    assert torch.equal(sample(logits, md), got)  # stateless: the same again


def test_draws_follow_the_restricted_softmax() -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0])
    n = 20000
    md = md_for(
        n,
        top_k=torch.full((n,), 3, dtype=torch.int64),
        temperature=torch.full((n,), 0.8),
        seeds=torch.arange(n, dtype=torch.int64),
        positions=torch.full((n,), 9, dtype=torch.int64),
    )
    counts = torch.bincount(sample(logits.expand(n, 5).clone(), md), minlength=5).float() / n
    want = torch.softmax(torch.tensor([2.0, 1.5, 1.0]) / 0.8, 0)
    torch.testing.assert_close(counts[:3], want, atol=0.015, rtol=0)
    assert counts[3:].sum() == 0


def test_logits_processors_two_and_three_arguments_in_order() -> None:
    calls = []

    def ban_token_1(out_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        calls.append(("two", list(out_ids)))
        logits[1] = NEG_INF
        return logits

    def boost_last_prompt(
        prompt_ids: list[int], out_ids: list[int], logits: torch.Tensor
    ) -> torch.Tensor:
        calls.append(("three", list(prompt_ids)))
        return (
            logits + torch.nn.functional.one_hot(torch.tensor(prompt_ids[-1]), logits.shape[0]) * 10
        )

    logits = torch.zeros(2, 4)
    md = md_for(
        2,
        output_token_ids=[[3], []],
        prompt_token_ids=[[0, 2], [1]],
        logits_processors=[(ban_token_1, boost_last_prompt), ()],
    )
    assert apply_logits_processors(logits, md) == {}
    assert logits[0].tolist() == [0, NEG_INF, 10, 0] and logits[1].tolist() == [0, 0, 0, 0]
    assert calls == [("two", [3]), ("three", [0, 2])]


def test_a_failing_processor_fails_its_row_only() -> None:
    def boom(out_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")

    def wrong_shape(out_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        return logits[:2]

    logits = torch.ones(3, 4)
    md = md_for(3, logits_processors=[(boom,), (wrong_shape,), ()])
    errors = apply_logits_processors(logits, md)
    assert errors[0] == "logits processor boom failed: ValueError: boom"
    assert "wrong_shape failed: TypeError: it must return a tensor of shape (4,)" in errors[1]
    assert 2 not in errors and torch.equal(logits, torch.ones(3, 4))


def test_temperature_changes_the_draw_distribution() -> None:
    logits = torch.tensor([1.0, 0.0])
    n = 20000
    for temp in (0.5, 2.0):
        md = md_for(n, temperature=torch.full((n,), temp), seeds=torch.arange(n, dtype=torch.int64))
        frac = sample(logits.expand(n, 2).clone(), md).float().mean().item()
        assert abs(frac - 1 / (1 + math.exp(1 / temp))) < 0.015


# docs/sampling.md step 6's min-p by hand: probabilities 0.4, 0.3, 0.2, 0.06, 0.04.
MIN_P = [
    (0.0, [True] * 5),  # 0 disables it
    (0.35, [True, True, True, False, False]),  # p >= 0.35 * 0.4 = 0.14
    (0.55, [True, True, False, False, False]),  # p >= 0.22
    (1.0, [True, False, False, False, False]),  # the most likely only
]


@pytest.mark.parametrize(("min_p", "kept"), MIN_P)
def test_min_p(min_p: float, kept: list[bool]) -> None:
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]]).log()
    out = apply_min_p(logits, torch.tensor([min_p]))
    assert (out[0] > NEG_INF).tolist() == kept
    assert torch.equal(out[0][out[0] > NEG_INF], logits[0][kept])  # kept logits unchanged


def test_min_p_rows_are_independent_and_tied_maxima_stay() -> None:
    logits = torch.tensor([[2.0, 2.0, 1.9, 0.0], [2.0, 2.0, 1.9, 0.0]])
    out = apply_min_p(logits, torch.tensor([1.0, 0.0]))
    assert (out > NEG_INF).tolist() == [[True, True, False, False], [True] * 4]


def test_min_p_comes_after_temperature_and_before_top_k_top_p() -> None:
    # vLLM's Sampler.sample (vllm/v1/sample/sampler.py): temperature, min-p, then top-k/top-p.
    logits = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04]).log()
    n = 64
    base = {"seeds": torch.arange(n, dtype=torch.int64), "positions": torch.full((n,), 3)}
    rows = logits.expand(n, 5).clone()

    def drawn(**kw: object) -> set[int]:
        return set(sample(rows, md_for(n, **{**base, **kw})).tolist())  # type: ignore[arg-type]

    # At temperature 2 the probabilities go as sqrt(p): id 3 is sqrt(0.06 / 0.4) = 0.39 of the
    # top, kept by min_p 0.35; at temperature 1 it is 0.15 of it, dropped.
    assert drawn(min_p=torch.full((n,), 0.35), temperature=torch.full((n,), 2.0)) <= {0, 1, 2, 3}
    assert 3 in drawn(min_p=torch.full((n,), 0.35), temperature=torch.full((n,), 2.0))
    assert drawn(min_p=torch.full((n,), 0.35)) == {0, 1, 2}
    # min_p 0.4 keeps 0.4, 0.3, 0.2, renormalised 4/9, 3/9, 2/9: top_p 0.75 then keeps two (top-p
    # first would have kept three, 0.4 + 0.3 < 0.75).
    assert drawn(min_p=torch.full((n,), 0.4), top_p=torch.full((n,), 0.75)) == {0, 1}
    assert drawn(min_p=torch.full((n,), 0.4)) == {0, 1, 2}
    assert drawn(min_p=torch.full((n,), 1.0)) == {0}


def test_greedy_rows_ignore_min_p() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9, 1.0], [0.0, 3.0, 2.9, 1.0]])
    md = md_for(2, temperature=torch.tensor([0.0, 1.0]), min_p=torch.tensor([1.0, 1.0]))
    assert sample(logits, md).tolist() == [1, 1]
