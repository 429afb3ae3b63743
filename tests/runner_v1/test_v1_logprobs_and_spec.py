"""Logprobs (values, ranks, tie order, bounded slices) and n-gram propose/accept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turnout.runner_v1.logprobs import compute_logprobs, rows_per_slice, top_k_ties_low_id
from turnout.runner_v1.spec_decode import accept_drafts, propose_ngram


def test_logprobs_values_ranks_and_top_k() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 50, generator=gen)
    tokens = torch.tensor([0, 5, 49, 3, 3, 10, 20])
    got = compute_logprobs(lambda a, b: logits[a:b], tokens, 4, 50, working_set_elems=100)
    ref = logits.log_softmax(-1)
    assert got.token_ids[:, 0].tolist() == tokens.tolist()
    np.testing.assert_allclose(
        got.logprobs[:, 0], ref.gather(1, tokens[:, None])[:, 0].numpy(), atol=1e-6
    )
    ref_top = ref.topk(4)
    assert got.token_ids[:, 1:].tolist() == ref_top.indices.tolist()
    np.testing.assert_allclose(got.logprobs[:, 1:], ref_top.values.numpy(), atol=1e-6)
    want_rank = (ref >= ref.gather(1, tokens[:, None])).sum(-1)
    assert got.ranks.tolist() == want_rank.tolist()
    assert got.position(0)[int(got.token_ids[0, 1])].rank == 1


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_ties_are_ordered_by_token_id(k: int) -> None:
    lps = torch.tensor([[0.0, 1.0, 1.0, 2.0, 1.0, 1.0]])
    ids, values = top_k_ties_low_id(lps, k)
    want = [3, 1, 2, 4, 5, 0][:k]
    assert ids[0].tolist() == want
    assert values[0].tolist() == lps[0, want].tolist()


def test_slices_bound_the_rows_per_temporary() -> None:
    assert rows_per_slice(1000, 4096) == 4 and rows_per_slice(10**6, 4096) == 1
    seen = []
    logits = torch.randn(10, 1000)
    compute_logprobs(
        lambda a, b: seen.append(b - a) or logits[a:b],
        torch.zeros(10, dtype=torch.int64),
        1000,
        1000,
        working_set_elems=4096,
    )
    assert seen == [4, 4, 2]


NGRAM = [
    ("repeat of a bigram", [1, 2, 3, 9, 1, 2], 1, 3, 3, [3, 9, 1]),
    ("latest occurrence wins", [1, 2, 5, 1, 2, 6, 1, 2], 2, 2, 2, [6, 1]),
    ("longest n first", [7, 2, 3, 8, 2, 3, 9, 7, 2, 3], 1, 3, 1, [8]),
    ("shorter proposal at the end", [4, 5, 4], 1, 2, 5, [5, 4]),
    ("no match", [1, 2, 3, 4], 1, 3, 3, []),
    ("min above available", [1, 1], 2, 3, 2, []),
    ("single token", [5], 1, 3, 2, []),
]


@pytest.mark.parametrize(
    ("note", "tokens", "lo", "hi", "k", "want"), NGRAM, ids=[n[0] for n in NGRAM]
)
def test_propose_ngram(
    note: str, tokens: list[int], lo: int, hi: int, k: int, want: list[int]
) -> None:
    assert propose_ngram(np.array(tokens), lo, hi, k) == want


ACCEPT = [
    ([], [5], [5]),
    ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),
    ([1, 2, 3], [1, 7, 3, 4], [1, 7]),
    ([1, 2], [9, 2, 3], [9]),
]


@pytest.mark.parametrize(("drafts", "targets", "want"), ACCEPT)
def test_accept_drafts(drafts: list[int], targets: list[int], want: list[int]) -> None:
    assert accept_drafts(drafts, targets) == want


def test_accept_needs_one_more_target() -> None:
    with pytest.raises(ValueError, match="2 drafts need 3 targets"):
        accept_drafts([1, 2], [1, 2])
