"""Post-update of speculative steps (kernels/spec_post_update.py): the kernel equals its torch
reference, and the counters advance by what was accepted."""

from __future__ import annotations

import torch
from kernel_cases import DEVICE

from turnout.kernels.spec_post_update import post_update_spec, post_update_spec_ref

I32 = torch.int32


def _case():
    # Rows: 4 decodes verifying 3, 3, 2 and 0 drafts; 1 partial prefill; 1 prefill that completes;
    # row 6 sits 2 cells before max_model_len.
    max_num_seqs, max_model_len = 9, 40
    params = torch.zeros(max_num_seqs, 8, dtype=I32)  # a packed table: strided columns
    token_ids = (
        torch.arange(max_num_seqs * max_model_len, dtype=I32).view(max_num_seqs, max_model_len) % 97
    )
    rows = torch.tensor([3, 0, 5, 8, 1, 2, 6], dtype=I32)
    num_computed = torch.tensor([10, 7, 20, 4, 0, 5, 37], dtype=I32)  # by batch position
    num_tokens = torch.tensor([11, 8, 21, 5, 12, 9, 38], dtype=I32)
    num_scheduled = torch.tensor([4, 4, 3, 1, 6, 4, 2], dtype=I32)
    num_spec = torch.tensor([3, 3, 2, 0, 0, 0, 1], dtype=I32)
    params[rows.long(), 0] = num_computed
    params[rows.long(), 1] = num_tokens
    params[rows.long(), 3:5] = 77  # garbage of an earlier step
    seq_lens = num_computed + num_scheduled
    sampled = torch.tensor(
        [
            [1, 2, 3, 4],
            [5, -1, -1, -1],
            [6, 7, 8, -1],
            [9, -1, -1, -1],
            [10, -1, -1, -1],
            [11, -1, -1, -1],
            [12, 13, -1, -1],
        ],
        dtype=I32,
    )
    num_sampled = torch.tensor([4, 1, 3, 1, 1, 1, 2], dtype=I32)
    num_drafts = torch.tensor([3, 2, 2, 0, 0, 0, 1], dtype=I32)
    args = [rows, num_scheduled, num_spec, seq_lens, sampled, num_sampled, num_drafts]
    return [a.to(DEVICE) for a in args], params.to(DEVICE), token_ids.to(DEVICE)


def _run(fn):
    args, params, token_ids = _case()
    fn(*args, params[:, 0], params[:, 1], params[:, 2], params[:, 3], params[:, 4], token_ids)
    return params.cpu(), token_ids.cpu()


def test_kernel_equals_reference_and_counts_accepted_tokens() -> None:
    (params, tokens), (want_params, want_tokens) = (
        _run(post_update_spec),
        _run(post_update_spec_ref),
    )
    assert torch.equal(params, want_params) and torch.equal(tokens, want_tokens)
    rows = [3, 0, 5, 8, 1, 2, 6]
    # num_computed: all 3 accepted -> +4; 0 of 2 valid -> +1; 2 of 2 -> +3; a decode -> +1;
    # a partial prefill -> +6; a completed prefill -> +4; 1 of 1 at the end of the table -> +2.
    assert params[rows, 0].tolist() == [14, 8, 23, 5, 6, 9, 39]
    assert params[rows, 1].tolist() == [15, 9, 24, 6, 12, 10, 40]
    assert params[rows, 2].tolist() == [
        4,
        5,
        8,
        9,
        0,
        11,
        13,
    ]  # last_sampled (none for the partial prefill)
    assert params[rows, 3].tolist() == [3, 2, 2, 0, 0, 0, 1]  # drafts verified
    assert params[rows, 4].tolist() == [3, 0, 2, 0, 0, 0, 1]  # drafts accepted
    assert tokens[3, 11:15].tolist() == [1, 2, 3, 4]
    assert tokens[0, 8].item() == 5 and tokens[8, 5].item() == 9
    assert tokens[6, 38:40].tolist() == [12, 13]
    _, before = _case()[1:]
    assert torch.equal(tokens[1], before[1].cpu())  # the partial prefill wrote nothing
