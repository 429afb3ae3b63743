"""Rejection sampling (kernels/rejection_sample.py): the kernel equals its torch reference, the
greedy rule is exact-match-then-argmax, and the sampled rule's output is distributed as the
target's distribution ``p`` whatever the draft's ``q`` (a chi-square test that rejects a
deliberately wrong rule)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

import turnout.kernels._select as select
import turnout.kernels.rejection_sample as rs
from turnout.kernels.gumbel_noise import uniform_noise_ref
from turnout.kernels.rejection_sample import rejection_sample, rejection_sample_ref

I32 = torch.int32


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of ``counts`` against ``probs`` (df = bins - 1): the upper
    tail ``Q(df / 2, stat / 2)`` of the regularised incomplete gamma function."""
    counts = (
        counts.cpu()
    )  # _run leaves its outputs on the kernel's device (CUDA where there is one)
    n = float(counts.sum())
    expected = probs.double() * n
    stat = float(((counts.double() - expected) ** 2 / expected).sum())
    df = counts.shape[0] - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


def _case(
    seed: int,
    *,
    num_reqs: int = 9,
    max_drafts: int = 3,
    vocab: int = 40,
    greedy_share: float = 0.4,
    with_q: bool = True,
):
    g = torch.Generator().manual_seed(seed)
    max_num_seqs = num_reqs + 3
    rows = torch.randperm(max_num_seqs, generator=g)[:num_reqs].to(I32)
    num_drafts = torch.randint(0, max_drafts + 1, (num_reqs,), generator=g, dtype=I32)
    per_req = (
        torch.randint(0, 2, (num_reqs,), generator=g, dtype=I32) + num_drafts + 1
    )  # rows >= drafts + 1
    cu = torch.zeros(num_reqs + 1, dtype=I32)
    cu[1:] = torch.cumsum(per_req, 0)
    num_rows = int(cu[-1])
    target_probs = torch.softmax(torch.randn(num_rows, vocab, generator=g) * 2, -1)
    draft_probs = torch.softmax(torch.randn(num_reqs, max_drafts, vocab, generator=g) * 2, -1)
    # Drafts: often the target's argmax (so that some are accepted), else random.
    argmax = target_probs.argmax(-1).to(I32)
    drafts = torch.randint(0, vocab, (num_reqs, max_drafts), generator=g, dtype=I32)
    for i in range(num_reqs):
        for j in range(max_drafts):
            if j < int(per_req[i]) - 1 and torch.rand(1, generator=g) < 0.6:
                drafts[i, j] = argmax[int(cu[i]) + j]
    target_sampled = torch.where(
        torch.rand(num_rows, generator=g) < 0.7,
        argmax,
        torch.randint(0, vocab, (num_rows,), generator=g, dtype=I32),
    )
    positions = torch.randint(5, 200, (num_rows,), generator=g, dtype=I32)
    packed = torch.zeros(max_num_seqs, 4, dtype=torch.float32)  # temperature: a strided column
    packed[:, 1] = (torch.rand(max_num_seqs, generator=g) >= greedy_share).float()
    seeds = torch.randint(0, 2**62, (max_num_seqs, 2), generator=g)
    args = [
        cu,
        rows,
        num_drafts,
        drafts,
        target_sampled,
        positions,
        target_probs,
        draft_probs if with_q else None,
        packed[:, 1],
        seeds[:, 0],
    ]
    return [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]


def _run(fn, args):
    num_reqs, max_drafts = args[3].shape
    out = torch.full((num_reqs, max_drafts + 1), 7, dtype=I32, device=DEVICE)
    num = torch.full((num_reqs,), -5, dtype=I32, device=DEVICE)
    fn(*args, out, num)
    return out, num


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize(("seed", "with_q"), [(0, True), (1, False), (2, True), (3, False)])
def test_kernel_equals_reference(
    seed: int, with_q: bool, narrow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if narrow:  # the residual draw over several vocabulary blocks
        monkeypatch.setattr(select, "MAX_INTERPRETER_BLOCK", 16)
    args = _case(seed, with_q=with_q)
    got, want = _run(rejection_sample, args), _run(rejection_sample_ref, args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    out, num = got
    for i in range(out.shape[0]):
        n = int(num[i])
        assert 1 <= n <= int(args[2][i]) + 1
        assert torch.equal(out[i, : n - 1], args[3][i, : n - 1])  # accepted drafts, in order
        assert (out[i, n:] == -1).all()


def test_greedy_accepts_the_matching_prefix_then_the_argmax() -> None:
    cu, rows, num_drafts, drafts, target_sampled, positions, _, _, temperature, seeds = _case(
        4, greedy_share=1.1
    )
    out, num = _run(
        rejection_sample,
        [cu, rows, num_drafts, drafts, target_sampled, positions, None, None, temperature, seeds],
    )
    for i in range(out.shape[0]):
        r0, nd = int(cu[i]), int(num_drafts[i])
        a = 0
        while a < nd and int(drafts[i, a]) == int(target_sampled[r0 + a]):
            a += 1
        assert int(num[i]) == a + 1
        assert out[i, : a + 1].tolist() == [*drafts[i, :a].tolist(), int(target_sampled[r0 + a])]


def test_self_draft_accepts_everything() -> None:
    # q == p: u * q < p holds for every u < 1, whatever the draft.
    cu, rows, num_drafts, drafts, target_sampled, positions, tp, q, temperature, seeds = _case(
        5, greedy_share=-1
    )
    q = q.clone()
    for i in range(drafts.shape[0]):
        for j in range(min(drafts.shape[1], int(cu[i + 1]) - int(cu[i]) - 1)):
            q[i, j] = tp[int(cu[i]) + j]
    _, num = _run(
        rejection_sample,
        [cu, rows, num_drafts, drafts, target_sampled, positions, tp, q, temperature, seeds],
    )
    assert torch.equal(num, num_drafts + 1)


P = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
Q = torch.tensor([0.05, 0.05, 0.1, 0.1, 0.3, 0.4])


def _first_tokens(num_samples: int, *, one_hot: bool = False) -> torch.Tensor:
    """The first output token of ``num_samples`` seeded requests that each verify one draft
    drawn from ``Q`` against the target ``P`` (the reference rule)."""
    n, v = num_samples, P.shape[0]
    g = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(Q, n, replacement=True, generator=g).to(I32)[:, None]
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 3
    args = [
        torch.arange(0, 2 * n + 1, 2, dtype=I32),
        torch.arange(n, dtype=I32),
        torch.ones(n, dtype=I32),
        drafts,
        torch.zeros(2 * n, dtype=I32),
        torch.full((2 * n,), 9, dtype=I32),
        P.repeat(2 * n, 1),
        None if one_hot else Q.repeat(n, 1, 1),
        torch.ones(n),
        seeds,
    ]
    out, _ = _run(rejection_sample_ref, args)
    return torch.bincount(out[:, 0].long(), minlength=v)


def test_sampled_output_is_distributed_as_the_target() -> None:
    assert chi_square_p_value(_first_tokens(3000), P) > 1e-3
    # Treating the drafts as one-hot proposals is also exact (n-gram's rule), only less often accepting.
    assert chi_square_p_value(_first_tokens(3000, one_hot=True), P) > 1e-3


def test_the_chi_square_test_rejects_a_wrong_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # Wrong: after a rejection, draw again from p instead of the residual max(p - q, 0).
    def from_p(p, q, d, seed, pos, fallback):
        u = uniform_noise_ref(seed, torch.tensor([pos], dtype=torch.int64), torch.tensor([[0]]))
        return int(torch.searchsorted(torch.cumsum(p, 0), u[0]).clamp(max=p.shape[0] - 1))

    monkeypatch.setattr(rs, "_residual_ref", from_p)
    assert chi_square_p_value(_first_tokens(3000), P) < 1e-6


def test_arguments_are_checked() -> None:
    args = _case(0)
    with pytest.raises(ValueError, match="output_token_ids must be"):
        rejection_sample(
            *args,
            torch.zeros(9, 3, dtype=I32, device=DEVICE),
            torch.zeros(9, dtype=I32, device=DEVICE),
        )
    bad = list(args)
    bad[6] = None  # draft probabilities without the target's
    with pytest.raises(ValueError, match="draft_probs need target_probs"):
        _run(rejection_sample, bad)
