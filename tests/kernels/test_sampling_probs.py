"""Processed probabilities (kernels/sampling_probs.py): equal to the torch reference, a
distribution over exactly the tokens the Gumbel-max sampler can draw, unwritten for greedy rows."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE
from test_gumbel_sample import _batch, _counts

import turnout.kernels._select as select
from turnout.kernels.gumbel_sample import gumbel_sample
from turnout.kernels.sampling_probs import compute_probs, compute_probs_ref


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize(("seed", "vocab_size"), [(0, 700), (3, 130)])
def test_probs_equal_reference_and_cover_the_sampler(
    seed: int, vocab_size: int, narrow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if narrow:
        monkeypatch.setattr(select, "MAX_INTERPRETER_BLOCK", 256)
    tables, idx, tokens, seq_lens, logits = _batch(seed, vocab_size)
    counts = _counts(tables, idx, tokens, seq_lens, vocab_size)
    got = torch.full_like(logits, -1.0)
    want = torch.full_like(logits, -1.0)
    compute_probs(logits, idx, seq_lens, tables, counts, got)
    compute_probs_ref(logits, idx, seq_lens, tables, counts, want)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    greedy = tables.temperature[idx.long()] == 0
    assert (got[greedy] == -1.0).all()  # greedy rows are left alone
    sampled = ~greedy
    assert bool(sampled.any())
    torch.testing.assert_close(got[sampled].sum(-1), torch.ones(int(sampled.sum()), device=DEVICE))
    drawn = torch.empty(idx.shape[0], dtype=torch.int32, device=DEVICE)
    gumbel_sample(logits, idx, seq_lens, tables, counts, drawn)
    assert (got[sampled].gather(1, drawn[sampled].long()[:, None]) > 0).all()


def test_shapes_are_checked() -> None:
    tables, idx, _, seq_lens, logits = _batch(0, 130)
    with pytest.raises(ValueError, match="probs_out must be"):
        compute_probs(logits, idx, seq_lens, tables, None, torch.zeros(3, 130, device=DEVICE))


def test_min_p_probs_are_the_hand_computed_distribution() -> None:
    # One row per case of test_gumbel_sample.MIN_P_CASES: zero outside the kept tokens, the
    # softmax of the (temperature-scaled) kept logits inside.
    from test_gumbel_sample import HAND_PROBS, MIN_P_CASES, min_p_tables

    n = len(MIN_P_CASES)
    tables = min_p_tables(MIN_P_CASES, 1)
    logits = torch.tensor(HAND_PROBS, device=DEVICE).log().repeat(n, 1)
    idx = torch.arange(n, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((n,), 30, dtype=torch.int32, device=DEVICE)
    got, ref = torch.full_like(logits, -1.0), torch.full_like(logits, -1.0)
    compute_probs(logits, idx, seq_lens, tables, None, got)
    compute_probs_ref(logits, idx, seq_lens, tables, None, ref)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    for i, (temperature, _, _, _, kept) in enumerate(MIN_P_CASES):
        p = torch.tensor(HAND_PROBS, dtype=torch.float64) ** (1 / temperature)
        want = torch.zeros(len(HAND_PROBS), dtype=torch.float64)
        want[kept] = p[kept] / p[kept].sum()
        torch.testing.assert_close(got[i].double().cpu(), want, atol=1e-6, rtol=1e-5)
