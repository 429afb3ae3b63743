"""The near-tie agreement of the GPU tests' logits comparisons (CPU)."""

from __future__ import annotations

import pytest
import torch
from logit_agreement import assert_logits_agree, ulp


def test_ulp_is_the_spacing_of_the_dtype() -> None:
    values = torch.tensor([1.0, 10.0, 100.0, -3.0])
    assert ulp(values, torch.bfloat16).tolist() == [2 ** -7, 2 ** -4, 2 ** -1, 2 ** -6]
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
    got[1, other] = want[1, top] + 3 * ulp(want[1, top], torch.bfloat16)  # a tiny RMS: one element moved
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
