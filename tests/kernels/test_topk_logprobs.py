"""Top-k logprobs with a bounded working set against a full log_softmax (docs/sampling.md step 1)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

import turnout.kernels._select as select
from turnout.kernels.topk_logprobs import topk_logprobs, topk_logprobs_ref


@pytest.fixture(autouse=True, params=["wide", "narrow"])
def block_width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU, run each case with the interpreter's wide blocks and with 256-wide blocks
    (several per row, as 1024-wide blocks on a GPU over a real vocabulary)."""
    if request.param == "narrow":
        monkeypatch.setattr(select, "MAX_INTERPRETER_BLOCK", 256)


def _run(fn, logits, tokens, k, max_k):
    # Inputs drawn on the CPU run on DEVICE (compiled kernels on CUDA); results come back.
    n = logits.shape[0]
    outs = (
        torch.full((n, max_k), -7, dtype=torch.int32, device=DEVICE),
        torch.full((n, max_k), 7.0, device=DEVICE),
        torch.zeros(n, device=DEVICE),
        torch.zeros(n, dtype=torch.int32, device=DEVICE),
    )
    fn(logits.to(DEVICE), tokens.to(DEVICE), k.to(DEVICE), *outs)
    return tuple(t.cpu() for t in outs)


@pytest.mark.parametrize(
    ("seed", "vocab_size", "max_k"), [(0, 1000, 5), (1, 3000, 20), (2, 77, 1), (3, 2048, 0)]
)
def test_matches_full_log_softmax(seed: int, vocab_size: int, max_k: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = 7
    logits = torch.randn(n, vocab_size, generator=g) * 3
    logits[1, 10:30] = 30.0  # a tie larger than k at the top
    logits[2, :] = 0.0  # everything ties
    logits[3, 5] = float("-inf")
    tokens = torch.randint(0, vocab_size, (n,), generator=g, dtype=torch.int32)
    tokens[1] = 12
    k = torch.randint(0, max_k + 1, (n,), generator=g, dtype=torch.int32)
    k[1] = max_k
    ids, lps, tok_lp, ranks = _run(topk_logprobs, logits, tokens, k, max_k)
    ids_ref, lps_ref, tok_lp_ref, ranks_ref = _run(topk_logprobs_ref, logits, tokens, k, max_k)
    assert torch.equal(ranks, ranks_ref)
    torch.testing.assert_close(tok_lp, tok_lp_ref, rtol=1e-5, atol=1e-5)
    for i, ki in enumerate(k.tolist()):  # the first k of each row (the rest is unspecified)
        assert torch.equal(ids[i, :ki], ids_ref[i, :ki])
        torch.testing.assert_close(lps[i, :ki], lps_ref[i, :ki], rtol=1e-5, atol=1e-5)
    if max_k:
        assert ids[1, :max_k].tolist() == list(range(10, 10 + max_k))  # ties: lower ids first
    assert int(ranks[1]) == 20  # 20 tokens tie at the top; the rank counts them all


def test_wide_k_and_sampled_token_rank() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5000, generator=g)
    tokens = logits.argmax(1).int()
    k = torch.tensor([64, 1, 33], dtype=torch.int32)
    ids, lps, tok_lp, ranks = _run(topk_logprobs, logits, tokens, k, 64)
    ids_ref, lps_ref, _, _ = _run(topk_logprobs_ref, logits, tokens, k, 64)
    for i, ki in enumerate(k.tolist()):
        assert torch.equal(ids[i, :ki], ids_ref[i, :ki])
        torch.testing.assert_close(lps[i, :ki], lps_ref[i, :ki], rtol=1e-5, atol=1e-5)
    assert ranks.tolist() == [1, 1, 1]
    assert torch.equal(ids[:, 0].long(), tokens.long())
    torch.testing.assert_close(tok_lp, lps[:, 0])


def test_k_up_to_the_whole_vocabulary() -> None:
    g = torch.Generator().manual_seed(6)
    vocab = 700
    logits = torch.randn(2, vocab, generator=g)
    logits[1, ::7] = 1.5  # many ties
    tokens = torch.tensor([3, 14], dtype=torch.int32)
    k = torch.tensor([vocab, 300], dtype=torch.int32)
    got = _run(topk_logprobs, logits, tokens, k, vocab)
    want = _run(topk_logprobs_ref, logits, tokens, k, vocab)
    assert torch.equal(got[0][0], want[0][0]) and torch.equal(got[0][1, :300], want[0][1, :300])
    torch.testing.assert_close(got[1][0], want[1][0], rtol=1e-5, atol=1e-5)
    assert sorted(got[0][0].tolist()) == list(range(vocab))
