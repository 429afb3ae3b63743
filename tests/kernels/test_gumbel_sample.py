"""The Gumbel-max sampler and penalty counts against their torch references (docs/sampling.md)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, sampling_tables

import turnout.kernels._select as select
from turnout.kernels.gumbel_noise import gumbel_noise_ref
from turnout.kernels.gumbel_sample import gumbel_sample, gumbel_sample_ref
from turnout.kernels.penalties import (
    COUNT_MASK,
    PROMPT_BIT,
    build_penalty_counts,
    build_penalty_counts_ref,
)

MAX_NUM_SEQS = 16


@pytest.fixture(autouse=True, params=["wide", "narrow"])
def block_width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU, run each case with the interpreter's wide blocks and with 256-wide blocks
    (several per row, as 1024-wide blocks on a GPU over a real vocabulary)."""
    if request.param == "narrow":
        monkeypatch.setattr(select, "MAX_INTERPRETER_BLOCK", 256)


def _batch(seed: int, vocab_size: int, num_reqs: int = 10):
    g = torch.Generator().manual_seed(seed)
    tables = sampling_tables(MAX_NUM_SEQS, seed=seed)
    idx_mapping = torch.randperm(MAX_NUM_SEQS, generator=g)[:num_reqs].to(torch.int32)
    token_ids = torch.randint(0, vocab_size, (MAX_NUM_SEQS, 80), generator=g, dtype=torch.int32)
    seq_lens = torch.randint(21, 80, (num_reqs,), generator=g, dtype=torch.int32)
    logits = torch.randn(num_reqs, vocab_size, generator=g) * 2
    logits[:, 3] += 6  # a stop id that min_tokens must mask
    logits[0, 100:110] = 9.0  # ties at the top
    return (
        tables,
        idx_mapping.to(DEVICE),
        token_ids.to(DEVICE),
        seq_lens.to(DEVICE),
        logits.to(DEVICE),
    )


def _counts(tables, idx_mapping, token_ids, seq_lens, vocab_size, fn=build_penalty_counts):
    counts = torch.zeros(idx_mapping.shape[0], vocab_size, dtype=torch.int32, device=DEVICE)
    fn(
        idx_mapping,
        seq_lens,
        token_ids,
        tables.num_prompt_tokens,
        tables.repetition_penalty,
        tables.frequency_penalty,
        tables.presence_penalty,
        counts,
    )
    return counts


@pytest.mark.parametrize("seed", range(3))
def test_penalty_counts_match_reference(seed: int) -> None:
    tables, idx, tokens, seq_lens, _ = _batch(seed, 500)
    counts = _counts(tables, idx, tokens, seq_lens, 500)
    assert torch.equal(
        counts, _counts(tables, idx, tokens, seq_lens, 500, build_penalty_counts_ref)
    )
    for i, row in enumerate(idx.tolist()):
        has = bool(
            tables.repetition_penalty[row] != 1
            or tables.frequency_penalty[row] != 0
            or tables.presence_penalty[row] != 0
        )
        n_prompt = int(tables.num_prompt_tokens[row])
        out = tokens[row, n_prompt : int(seq_lens[i])].long()
        want = (
            torch.bincount(out, minlength=500).int()
            if has
            else torch.zeros(500, dtype=torch.int32, device=DEVICE)
        )
        assert torch.equal(counts[i] & COUNT_MASK, want)
        assert bool(((counts[i] & PROMPT_BIT) != 0)[tokens[row, :n_prompt].long()].all()) == has


# Vocabularies by the blocks they make (GPU: 1024 wide; CPU: one block, or 256 when narrow):
# 700 one partial GPU block (3 narrow, a partial last); 1300 two GPU blocks, a partial last
# (6 narrow); 2048 exact multiples everywhere (2 GPU blocks, 8 narrow, one wide); 130 less than
# one narrow block. Each narrow block costs radix passes in the interpreter: 2500 and 4096
# covered the same cases with 10 and 16 blocks, in 25 s of CPU (these two: 14 s).
@pytest.mark.parametrize(("seed", "vocab_size"), [(0, 700), (1, 1300), (2, 2048), (3, 130)])
def test_sampler_matches_reference(seed: int, vocab_size: int) -> None:
    tables, idx, tokens, seq_lens, logits = _batch(seed, vocab_size)
    counts = _counts(tables, idx, tokens, seq_lens, vocab_size)
    out, ref = (torch.full((idx.shape[0],), -1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    gumbel_sample(logits, idx, seq_lens, tables, counts, out)
    gumbel_sample_ref(logits, idx, seq_lens, tables, counts, ref)
    assert torch.equal(out, ref)
    # Without penalties the counts are skipped altogether.
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    gumbel_sample_ref(logits, idx, seq_lens, tables, None, ref)
    assert torch.equal(out, ref)


def test_greedy_is_argmax_lowest_id_and_min_tokens_masks_stop_ids() -> None:
    tables, idx, _tokens, seq_lens, logits = _batch(0, 300, num_reqs=4)
    tables.temperature.zero_()
    tables.min_tokens.zero_()
    tables.repetition_penalty.fill_(1.0)
    tables.frequency_penalty.zero_()
    tables.presence_penalty.zero_()
    logits[1, :] = 0.0
    logits[1, 7] = logits[1, 9] = 1.0
    out = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    assert out.tolist()[1] == 7 and out.tolist() == logits.argmax(1).int().tolist()
    logits[2, :] = -1.0
    logits[2, 3] = 50.0  # stop id 3, masked while fewer than min_tokens are out
    row = int(idx[2])
    tables.min_tokens[row] = int(seq_lens[2]) - int(tables.num_prompt_tokens[row]) + 1
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    assert int(out[2]) != 3
    tables.min_tokens[row] -= 1  # now exactly min_tokens are out: 3 may be sampled
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    assert int(out[2]) == 3


def test_samples_are_a_function_of_seed_and_position_only() -> None:
    tables, idx, _tokens, seq_lens, logits = _batch(4, 600)
    out = torch.zeros(idx.shape[0], dtype=torch.int32, device=DEVICE)
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    perm = torch.tensor([4, 0, 7], device=DEVICE)
    sub = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    gumbel_sample(logits[perm].contiguous(), idx[perm], seq_lens[perm], tables, None, sub)
    assert torch.equal(sub, out[perm])


def test_plain_sampling_is_argmax_of_scaled_logits_plus_shared_noise() -> None:
    tables, idx, _tokens, seq_lens, logits = _batch(5, 900, num_reqs=6)
    tables.temperature.fill_(0.8)
    tables.top_k.fill_(-1)
    tables.top_p.fill_(1.0)
    tables.min_p.zero_()
    tables.min_tokens.zero_()
    out = torch.zeros(6, dtype=torch.int32, device=DEVICE)
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    g = gumbel_noise_ref(tables.seed[idx.long()], seq_lens.long(), 900)
    assert out.tolist() == (logits / torch.tensor(0.8) + g).argmax(1).int().tolist()


def test_top_k_and_top_p_restrict_the_support() -> None:
    # Many seeds on one row: every draw lies in the kept set, and the kept set is reached.
    n, vocab_size = 64, 50
    tables = sampling_tables(n, seed=9)
    tables.temperature.fill_(1.0)
    tables.repetition_penalty.fill_(1.0)
    tables.frequency_penalty.zero_()
    tables.presence_penalty.zero_()
    tables.min_tokens.zero_()
    tables.min_p.zero_()
    tables.seed.copy_(torch.arange(n))
    logits = torch.linspace(3, -3, vocab_size, device=DEVICE).repeat(n, 1)  # token 0 most likely
    idx = torch.arange(n, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((n,), 30, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    tables.top_k.fill_(4)
    tables.top_p.fill_(1.0)
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    assert set(out.tolist()) == {0, 1, 2, 3}
    tables.top_k.fill_(-1)
    probs = torch.softmax(logits[0], 0)
    top_p = float(probs[:3].sum()) - 1e-4  # tokens 0..2 reach it
    tables.top_p.fill_(top_p)
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    assert set(out.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("num_splits", [2, 3, 7])
def test_split_sampling_equals_the_unsplit_and_the_reference(num_splits: int) -> None:
    # Greedy, plain temperature, min-p, top-k and top-p rows in one batch, penalties and
    # min_tokens, and a greedy row whose maximum ties across two slices (ids 300 and 600;
    # narrow blocks make slices of 256 or 512 ids): the lowest id wins, as unsplit.
    vocab_size = 1500
    tables, idx, tokens, seq_lens, logits = _batch(11, vocab_size)
    logits[0, 300] = logits[0, 600] = 40.0
    rows = idx.long()
    tables.temperature[rows[:3]] = 0.0
    tables.top_k[rows[3:6]] = -1
    tables.top_p[rows[3:6]] = 1.0
    tables.min_p[rows[3:6]] = 0.0
    counts = _counts(tables, idx, tokens, seq_lens, vocab_size)
    ref, unsplit, split = (
        torch.full((idx.shape[0],), -1, dtype=torch.int32, device=DEVICE) for _ in range(3)
    )
    gumbel_sample_ref(logits, idx, seq_lens, tables, counts, ref)
    gumbel_sample(logits, idx, seq_lens, tables, counts, unsplit, num_splits=1)
    gumbel_sample(logits, idx, seq_lens, tables, counts, split, num_splits=num_splits)
    assert torch.equal(unsplit, ref) and torch.equal(split, ref)
    assert int(split[0]) == 300 or float(tables.temperature[rows[0]]) != 0.0


def test_split_count_follows_the_batch() -> None:
    from turnout.kernels.gumbel_sample import sample_splits

    assert sample_splits(256, 151_936, 1024) == 8  # 2,048 programs
    assert sample_splits(1, 151_936, 1024) == 18  # slices of at least 8 blocks
    assert sample_splits(4096, 151_936, 1024) == 1
    assert sample_splits(8, 500, 1024) == 1  # one block: nothing to split
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        tables, idx, _, seq_lens, logits = _batch(0, 300, num_reqs=2)
        gumbel_sample(
            logits,
            idx,
            seq_lens,
            tables,
            None,
            torch.zeros(2, dtype=torch.int32, device=DEVICE),
            num_splits=0,
        )


# docs/sampling.md step 6's min-p by hand: probabilities 0.4, 0.3, 0.2, 0.06, 0.04 at
# temperature 1. (temperature, min_p, top_k, top_p, the tokens kept.)
HAND_PROBS = [0.4, 0.3, 0.2, 0.06, 0.04]
MIN_P_CASES = [
    (1.0, 0.0, -1, 1.0, [0, 1, 2, 3, 4]),  # 0 disables it
    (1.0, 0.35, -1, 1.0, [0, 1, 2]),  # p >= 0.35 * 0.4 = 0.14
    (2.0, 0.35, -1, 1.0, [0, 1, 2, 3]),  # after temperature: sqrt(p / 0.4) >= 0.35 (0.39 for id 3)
    (1.0, 0.4, 2, 1.0, [0, 1]),  # then top-k
    # then top-p, over what min-p left (4/9 + 3/9 reach 0.75; top-p first would keep id 2 too)
    (1.0, 0.4, -1, 0.75, [0, 1]),
    (1.0, 1.0, -1, 1.0, [0]),  # only the most likely
]


def min_p_tables(cases: list[tuple], rows_per_case: int):
    """A table of ``rows_per_case`` rows per case (seeds 0, 1, ...), no penalties or masks."""
    n = len(cases) * rows_per_case
    tables = sampling_tables(n)
    tables.repetition_penalty.fill_(1.0)
    for name in ("frequency_penalty", "presence_penalty", "min_tokens"):
        getattr(tables, name).zero_()
    tables.seed.copy_(torch.arange(n))
    for i, (temperature, min_p, top_k, top_p, *_) in enumerate(cases):
        rows = slice(i * rows_per_case, (i + 1) * rows_per_case)
        tables.temperature[rows] = temperature
        tables.min_p[rows] = min_p
        tables.top_k[rows] = top_k
        tables.top_p[rows] = top_p
    return tables


def test_min_p_draws_only_the_hand_computed_tokens() -> None:
    per_case = 32
    tables = min_p_tables(MIN_P_CASES, per_case)
    n = len(MIN_P_CASES) * per_case
    logits = torch.tensor(HAND_PROBS, device=DEVICE).log().repeat(n, 1)
    idx = torch.arange(n, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((n,), 30, dtype=torch.int32, device=DEVICE)
    out, ref = (torch.full((n,), -1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    gumbel_sample_ref(logits, idx, seq_lens, tables, None, ref)
    assert torch.equal(out, ref)
    for i, (*_, kept) in enumerate(MIN_P_CASES):
        drawn = set(out[i * per_case : (i + 1) * per_case].tolist())
        assert drawn <= set(kept), MIN_P_CASES[i]
        if len(kept) <= 3:  # each kept token has probability >= 2/9 then: 32 draws reach it
            assert drawn == set(kept), MIN_P_CASES[i]


def test_min_p_1_keeps_the_tied_maxima_and_greedy_ignores_min_p() -> None:
    tables = min_p_tables([(0.7, 1.0, -1, 1.0), (0.0, 1.0, -1, 1.0)], 32)
    logits = torch.tensor([2.0, 2.0, 1.9, 0.0, -1.0], device=DEVICE).repeat(64, 1)
    idx = torch.arange(64, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((64,), 9, dtype=torch.int32, device=DEVICE)
    out = torch.full((64,), -1, dtype=torch.int32, device=DEVICE)
    gumbel_sample(logits, idx, seq_lens, tables, None, out)
    assert set(out[:32].tolist()) == {0, 1}  # only the maxima (id 2 is 0.87 of them at 0.7)
    assert out[32:].tolist() == [0] * 32  # greedy: argmax, lowest id


@pytest.mark.parametrize(("seed", "vocab_size"), [(5, 130), (6, 700)])
def test_min_p_rows_match_reference(seed: int, vocab_size: int) -> None:
    # Every row samples with min-p (several values), over the tables' top-k, top-p, penalties
    # and min_tokens; ties at the top in row 0.
    tables, idx, tokens, seq_lens, logits = _batch(seed, vocab_size)
    rows = idx.long()
    tables.temperature[rows] = torch.tensor([0.5, 1.0, 1.5, 0.8, 1.2] * 2, device=DEVICE)
    tables.min_p[rows] = torch.tensor([0.01, 0.05, 0.1, 0.3, 1.0] * 2, device=DEVICE)
    counts = _counts(tables, idx, tokens, seq_lens, vocab_size)
    out, ref = (torch.full((idx.shape[0],), -1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    gumbel_sample(logits, idx, seq_lens, tables, counts, out)
    gumbel_sample_ref(logits, idx, seq_lens, tables, counts, ref)
    assert torch.equal(out, ref)
