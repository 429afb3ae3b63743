"""n-gram drafts on the device (vLLM's ``ngram_gpu``): prompt lookup decoding (Saxena 2023)
over each request's token table, so that a runner keeping token ids on the device proposes
without the host ever seeing them.

For request ``i`` (table row ``r``, ``T = num_tokens[r]`` tokens so far, ``num_spec[i]`` drafts
scheduled): for ``n`` from ``MAX_N`` down to ``MIN_N`` (``n <= T - 1``), find the latest earlier
occurrence of the last ``n`` tokens (a window starting at ``0 .. T - 1 - n``, never the suffix
itself); the first ``n`` with a match proposes the tokens that followed it, at most
``num_spec[i]``, ``MAX_DRAFTS`` and the ``T - start`` tokens there are, and no position at or past
``max_model_len``. The same rule as runner_v1's CPU proposer (``runner_v1/spec_decode.py``).

The drafts are written to ``drafts_out[i, :num_drafts[i]]`` (``-1`` after) and into the token
table after the request's tokens (cells ``T .. T + num_drafts - 1``, which hold nothing yet:
they are read as the step's draft inputs, and overwritten by the tokens the step accepts). The
scheduled cells past the drafts (``T + num_drafts .. T + num_spec - 1``, within
``max_model_len``) get the request's last token: the step feeds them to the target too, and a
cell must never hand it what an earlier owner of the row left there.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import (
    check_at_least,
    check_dtypes,
    check_flat,
    check_matrix,
    check_table,
)
from turnout.kernels._triton import require_triton, tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _ngram_propose_kernel(  # type: ignore[no-untyped-def]
    idx_mapping_ptr,
    num_spec_ptr,
    num_tokens_ptr,
    num_tokens_stride,
    token_ids_ptr,
    token_ids_stride,
    drafts_ptr,
    drafts_stride,
    num_drafts_ptr,
    max_model_len,
    MIN_N: tl.constexpr,
    MAX_N: tl.constexpr,
    MAX_DRAFTS: tl.constexpr,
    DRAFT_BLOCK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    tokens = token_ids_ptr + row * token_ids_stride
    num_tokens = tl.load(num_tokens_ptr + row * num_tokens_stride)
    num_spec = tl.load(num_spec_ptr + i)
    offs = tl.arange(0, BLOCK_SIZE)
    found = num_tokens < 0
    cont = tl.full([], 0, tl.int32)  # where the proposal starts in the table
    for n in tl.static_range(MAX_N, MIN_N - 1, -1):  # longest suffix first
        if (~found) & (num_spec > 0) & (num_tokens - 1 >= n):
            last = tl.full([], -1, tl.int32)
            for block_start in range(0, num_tokens - n, BLOCK_SIZE):
                start = block_start + offs
                valid = start < num_tokens - n
                match = valid
                for t in tl.static_range(n):
                    tok = tl.load(tokens + start + t, mask=valid, other=-1)
                    match = match & (tok == tl.load(tokens + num_tokens - n + t))
                last = tl.maximum(last, tl.max(tl.where(match, start, -1), axis=0))
            if last >= 0:
                found = last >= 0
                cont = last + n
    count = tl.minimum(
        tl.minimum(num_tokens - cont, num_spec), tl.minimum(max_model_len - num_tokens, MAX_DRAFTS)
    )
    count = tl.where(found, tl.maximum(count, 0), 0)
    j = tl.arange(0, DRAFT_BLOCK)
    take = j < count
    drafts = tl.load(tokens + cont + j, mask=take, other=-1)
    last = tl.load(tokens + num_tokens - 1)
    fill = (j < num_spec) & (j < MAX_DRAFTS) & (num_tokens + j < max_model_len)
    tl.store(tokens + num_tokens + j, tl.where(take, drafts, last), mask=fill)
    tl.store(drafts_ptr + i * drafts_stride + j, drafts, mask=j < MAX_DRAFTS)
    tl.store(num_drafts_ptr + i, count)


def ngram_propose(
    idx_mapping: torch.Tensor,  # [num_reqs] int32, batch position -> table row
    num_spec: torch.Tensor,  # [num_reqs] int32, drafts scheduled per request (0: propose none)
    num_tokens: torch.Tensor,  # [max_num_seqs] int32 (any stride): tokens in each row
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32, drafts written after the tokens
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    drafts_out: torch.Tensor,  # [num_reqs, max_num_drafts] int32, written (-1 after the drafts)
    num_drafts_out: torch.Tensor,  # [num_reqs] int32, written
) -> None:
    """Propose n-gram drafts for each request on the device (Triton; see the module docstring).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or bounds do not match the annotations.
    """
    require_triton()
    _check(
        idx_mapping,
        num_spec,
        num_tokens,
        token_ids,
        prompt_lookup_min,
        prompt_lookup_max,
        drafts_out,
        num_drafts_out,
    )
    num_reqs, max_drafts = drafts_out.shape
    if num_reqs == 0:
        return
    _ngram_propose_kernel[(num_reqs,)](
        idx_mapping,
        num_spec,
        num_tokens,
        num_tokens.stride(0),
        token_ids,
        token_ids.stride(0),
        drafts_out,
        drafts_out.stride(0),
        num_drafts_out,
        token_ids.shape[1],
        MIN_N=prompt_lookup_min,
        MAX_N=prompt_lookup_max,
        MAX_DRAFTS=max_drafts,
        DRAFT_BLOCK=triton.next_power_of_2(max_drafts),
        BLOCK_SIZE=128,
    )


def ngram_propose_ref(
    idx_mapping: torch.Tensor,
    num_spec: torch.Tensor,
    num_tokens: torch.Tensor,
    token_ids: torch.Tensor,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    drafts_out: torch.Tensor,
    num_drafts_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`ngram_propose` (same arguments; one request at a time)."""
    _check(
        idx_mapping,
        num_spec,
        num_tokens,
        token_ids,
        prompt_lookup_min,
        prompt_lookup_max,
        drafts_out,
        num_drafts_out,
    )
    max_model_len, max_drafts = token_ids.shape[1], drafts_out.shape[1]
    drafts_out.fill_(-1)
    for i, row in enumerate(idx_mapping.tolist()):
        n_tok, want = int(num_tokens[row]), int(num_spec[i])
        history = token_ids[row, :n_tok]
        proposal = torch.zeros(0, dtype=token_ids.dtype, device=token_ids.device)
        for n in range(min(prompt_lookup_max, n_tok - 1), prompt_lookup_min - 1, -1):
            if want <= 0:
                break
            windows = history[:-1].unfold(0, n, 1)  # starts 0 .. n_tok - 1 - n
            hits = torch.nonzero((windows == history[n_tok - n :]).all(dim=1)).flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                proposal = history[start : start + min(want, max_drafts, max_model_len - n_tok)]
                break
        count = int(proposal.shape[0])
        filled = max(0, min(want, max_drafts, max_model_len - n_tok))
        token_ids[row, n_tok : n_tok + filled] = history[
            n_tok - 1
        ]  # the scheduled cells past the drafts
        token_ids[row, n_tok : n_tok + count] = proposal.clone()
        drafts_out[i, :count] = proposal
        num_drafts_out[i] = count


def _check(
    idx_mapping: torch.Tensor,
    num_spec: torch.Tensor,
    num_tokens: torch.Tensor,
    token_ids: torch.Tensor,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    drafts_out: torch.Tensor,
    num_drafts_out: torch.Tensor,
) -> None:
    i32 = torch.int32
    check_dtypes(
        idx_mapping=(idx_mapping, i32),
        num_spec=(num_spec, i32),
        num_tokens=(num_tokens, i32),
        token_ids=(token_ids, i32),
        num_drafts_out=(num_drafts_out, i32),
    )
    check_flat(idx_mapping=idx_mapping, num_spec=num_spec, num_drafts_out=num_drafts_out)
    check_table("token_ids", token_ids)
    check_matrix("drafts_out", drafts_out, i32, "[num_reqs, max_num_drafts]")
    check_at_least(
        drafts_out.shape[0],
        "num_reqs",
        idx_mapping=idx_mapping,
        num_spec=num_spec,
        num_drafts_out=num_drafts_out,
    )
    if drafts_out.shape[1] < 1 or not 1 <= prompt_lookup_min <= prompt_lookup_max:
        raise ValueError(
            f"need max_num_drafts >= 1 and 1 <= prompt_lookup_min ({prompt_lookup_min}) <= "
            f"prompt_lookup_max ({prompt_lookup_max}), drafts_out {tuple(drafts_out.shape)}"
        )


__all__ = ["ngram_propose", "ngram_propose_ref"]
