"""GPU n-gram proposals (kernels/ngram_propose.py): the kernel equals its torch reference, and
both propose what runner_v1's CPU proposer does over the same history."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_cases import DEVICE

from turnout.kernels.ngram_propose import ngram_propose, ngram_propose_ref
from turnout.runner_v1.spec_decode import propose_ngram

I32 = torch.int32


def _table(seed: int, *, max_num_seqs: int = 8, max_model_len: int = 96):
    g = torch.Generator().manual_seed(seed)
    token_ids = torch.full((max_num_seqs, max_model_len), -7, dtype=I32)
    packed = torch.zeros(max_num_seqs, 3, dtype=I32)  # num_tokens: a strided column
    for r in range(max_num_seqs):
        n = int(torch.randint(1, max_model_len - 4, (1,), generator=g)) if r else max_model_len
        base = torch.randint(
            0, 9, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g, dtype=I32
        )
        seq = base.repeat(max_model_len // base.shape[0] + 1)[:n].clone()
        noise = torch.rand(n, generator=g) < 0.1  # break some repeats
        seq[noise] = torch.randint(0, 30, (int(noise.sum()),), generator=g, dtype=I32)
        token_ids[r, :n] = seq
        packed[r, 1] = n
    return token_ids, packed


def _run(fn, token_ids, num_tokens, rows, num_spec, lo, hi, k):
    table = token_ids.clone().to(DEVICE)
    drafts = torch.full((rows.shape[0], k), 5, dtype=I32, device=DEVICE)
    num = torch.full((rows.shape[0],), -3, dtype=I32, device=DEVICE)
    fn(rows.to(DEVICE), num_spec.to(DEVICE), num_tokens.to(DEVICE), table, lo, hi, drafts, num)
    return table.cpu(), drafts.cpu(), num.cpu()


@pytest.mark.parametrize(
    ("seed", "lo", "hi", "k"), [(0, 1, 3, 3), (1, 2, 4, 5), (2, 1, 1, 1), (6, 3, 3, 4)]
)
def test_kernel_equals_reference_and_the_cpu_proposer(seed: int, lo: int, hi: int, k: int) -> None:
    token_ids, packed = _table(seed)
    g = torch.Generator().manual_seed(seed + 100)
    rows = torch.randperm(token_ids.shape[0], generator=g)[:6].to(I32)
    num_spec = torch.randint(0, k + 1, (6,), generator=g, dtype=I32)
    num_spec[0] = k
    got = _run(ngram_propose, token_ids, packed[:, 1], rows, num_spec, lo, hi, k)
    want = _run(ngram_propose_ref, token_ids, packed[:, 1], rows, num_spec, lo, hi, k)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    table, drafts, num = got
    found = 0
    for i, row in enumerate(rows.tolist()):
        n = int(packed[row, 1])
        history = token_ids[row, :n].numpy()
        cpu = propose_ngram(history, lo, hi, k)[: int(num_spec[i])]
        cpu = cpu[: max(0, token_ids.shape[1] - n)]  # no cell at or past max_model_len
        assert drafts[i, : int(num[i])].tolist() == cpu
        assert (drafts[i, int(num[i]) :] == -1).all()
        assert (
            table[row, n : n + len(cpu)].tolist() == cpu
        )  # the drafts follow the tokens in the table
        assert torch.equal(table[row, :n], token_ids[row, :n])
        # The other scheduled cells hold the last token (never an earlier owner's value).
        filled = min(int(num_spec[i]), k, token_ids.shape[1] - n)
        assert (table[row, n + len(cpu) : n + filled] == token_ids[row, n - 1]).all()
        assert (table[row, n + max(filled, len(cpu)) :] == -7).all()
        found += bool(cpu)
    assert found >= 2  # the case proposes something


def test_no_drafts_when_none_are_scheduled_or_nothing_matches() -> None:
    token_ids = torch.full((2, 16), -1, dtype=I32)
    token_ids[0, :6] = torch.tensor([1, 2, 3, 4, 5, 6])
    token_ids[1, :6] = torch.tensor([1, 2, 1, 2, 1, 2])
    num_tokens = torch.tensor([6, 6], dtype=I32)
    rows = torch.tensor([0, 1], dtype=I32)
    _, drafts, num = _run(
        ngram_propose, token_ids, num_tokens, rows, torch.tensor([3, 0], dtype=I32), 1, 3, 3
    )
    assert num.tolist() == [0, 0] and (drafts == -1).all()
    _, drafts, num = _run(
        ngram_propose, token_ids, num_tokens, rows, torch.tensor([3, 3], dtype=I32), 1, 3, 3
    )
    # The latest match of [2, 1, 2] starts at 1: the two tokens after it, as on the CPU.
    assert num.tolist() == [0, 2] and drafts[1].tolist() == [1, 2, -1]
    assert propose_ngram(np.array([1, 2, 1, 2, 1, 2]), 1, 3, 3) == [1, 2]


def test_arguments_are_checked() -> None:
    token_ids = torch.zeros(2, 8, dtype=I32)
    one = torch.zeros(1, dtype=I32)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        ngram_propose(one, one, one, token_ids, 3, 2, torch.zeros(1, 2, dtype=I32), one)
    with pytest.raises(ValueError, match="num_spec must be int32"):
        ngram_propose(one, one.long(), one, token_ids, 1, 2, torch.zeros(1, 2, dtype=I32), one)
