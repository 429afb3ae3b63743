"""The near-tie agreement of the GPU tests' logits comparisons (CPU)."""

from __future__ import annotations

import pytest
import torch
from logit_agreement import assert_logits_agree, ulp


def test_ulp_is_the_spacing_of_the_dtype() -> None:
    values = torch.tensor([1.0, 10.0, 100.0, -3.0])
    assert ulp(values, torch.bfloat16).tolist() == [2**-7, 2**-4, 2**-1, 2**-6]
    for v in (1.0, 10.0, 100.0):  # the next bf16 number above v is v + ulp
        x = torch.tensor([v], dtype=torch.bfloat16)
        assert (x.float() + ulp(x, torch.bfloat16)).bfloat16().item() > x.item()
        assert (x.float() + ulp(x, torch.bfloat16) / 4).bfloat16().item() == x.item()


def _rows() -> torch.Tensor:
    return torch.randn(6, 5000, generator=torch.Generator().manual_seed(0)) * 4


def test_a_flip_within_two_ulps_is_a_tie() -> None:
    want = _rows().bfloat16().float()
    got = want.clone()
    top = want[0].argmax()
    second = want[0].clone()
    second[top] = float("-inf")
    other = second.argmax()
    want[0, other] = want[0, top] - 2 * ulp(want[0, top], torch.bfloat16)  # two ulps below the best
    got[0, other] = want[0, top] + 1.0  # got picks it
    assert_logits_agree(got, want, "tie", min_cos=0.9)


def test_a_flip_three_ulps_away_fails() -> None:
    want = _rows().bfloat16().float()
    got = want.clone()
    top = want[1].argmax()
    second = want[1].clone()
    second[top] = float("-inf")
    other = second.argmax()
    want[1, other] = want[1, top] - 3 * ulp(want[1, top], torch.bfloat16)
    got[1, other] = want[1, top] + 3 * ulp(
        want[1, top], torch.bfloat16
    )  # a tiny RMS: one element moved
    with pytest.raises(AssertionError, match="beyond a near tie"):
        assert_logits_agree(got, want, "three ulps", min_cos=0.9)


def test_a_flip_beyond_the_noise_and_the_ulp_fails() -> None:
    want = _rows()
    got = want.clone()
    worst = want[2].argmin()
    got[2, worst] = want[2].max() + 1.0  # picks a token far from the best
    with pytest.raises(AssertionError, match="beyond a near tie"):
        assert_logits_agree(got, want, "flip", min_cos=0.5)


def test_a_low_cosine_fails() -> None:
    want = _rows()
    with pytest.raises(AssertionError, match="cosine"):
        assert_logits_agree(-want, want, "opposite", min_cos=0.9)


def _near_tie_batch() -> tuple[torch.Tensor, torch.Tensor]:
    # The H200 case the helper was written for (test_decoder_gpu.py, 2026-12-02): 306 rows,
    # best logits of 4-8, every row's cosine >= 0.9999, a few top-1 flips at near ties. Here:
    # two paths with independent errors of 1 % of the logits' scale, each rounded to bf16.
    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(306, 8192, generator=gen) * 1.5
    noisy = exact + torch.randn(306, 8192, generator=gen) * 0.015
    return noisy.bfloat16().float(), exact.bfloat16().float()


def test_the_near_tie_batch_it_was_written_for_passes() -> None:
    got, want = _near_tie_batch()
    flips = int((got.argmax(-1) != want.argmax(-1)).sum())
    assert 3 <= flips <= 20  # the case has flips to allow (8 with this seed)
    assert torch.nn.functional.cosine_similarity(got, want, dim=-1).min() >= 0.9999
    assert_logits_agree(got, want, "near ties", min_cos=0.999)


@pytest.mark.parametrize("factor", [2.0, 0.5, 1.1])
def test_logits_scaled_by_a_factor_fail(factor: float) -> None:
    # A temperature-like error (a scale applied twice or missed) keeps every row's cosine at
    # 1 and every argmax, yet changes every probability.
    want = _rows()
    with pytest.raises(AssertionError, match="relative error"):
        assert_logits_agree(want * factor, want, "scaled", min_cos=0.999)


def test_a_flip_hidden_behind_a_scale_fails() -> None:
    # Doubled logits inflate the RMS difference to the logits' own scale: 4x of it allowed
    # any row to pick its tenth-best token.
    want = _rows()
    got = want * 2
    tenth = want.topk(10, dim=-1).indices[:, -1]
    got[torch.arange(want.shape[0]), tenth] = got.max(-1).values + 1.0
    with pytest.raises(AssertionError):
        assert_logits_agree(got, want, "scaled flips", min_cos=0.999)


def test_a_flip_hidden_behind_a_shift_fails() -> None:
    # A per-row constant changes no probability, so it is no noise either: a shift of 0.45
    # (cosine 0.994) allowed every row to pick its second-best token (gaps of 0.05-1.55).
    want = _rows()
    got = want + 0.45
    second = want.topk(2, dim=-1).indices[:, 1]
    got[torch.arange(want.shape[0]), second] = got.max(-1).values + 0.01
    assert torch.nn.functional.cosine_similarity(got, want, dim=-1).min() >= 0.99
    with pytest.raises(AssertionError, match="beyond a near tie"):
        assert_logits_agree(got, want, "shifted flips", min_cos=0.99)


def test_flat_logits_against_offset_logits_fail() -> None:
    # A path that lost the logits' variation (all equal but for its pick, each row's token at
    # the upper quartile) keeps a cosine of 0.998 against logits of mean 20 and spread 1.2.
    want = (20 + _rows() * 0.3).bfloat16().float()
    got = torch.full_like(want, 20.0)
    quartile = want.topk(want.shape[1] // 4, dim=-1).indices[:, -1]
    got[torch.arange(want.shape[0]), quartile] = 20.01
    assert torch.nn.functional.cosine_similarity(got, want, dim=-1).min() >= 0.99
    with pytest.raises(AssertionError, match="relative error"):
        assert_logits_agree(got, want, "flat", min_cos=0.99)


def test_rows_of_another_shape_fail() -> None:
    # One row against many broadcast (a comparison of the last position only): rows of one
    # prompt's logits can be alike enough for every cosine to pass.
    base = _rows()[:1]
    want = base + 0.01 * _rows()
    with pytest.raises(AssertionError, match="shapes"):
        assert_logits_agree(want[:1], want, "one row", min_cos=0.999)
