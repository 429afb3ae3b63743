"""Logprobs from raw logits: a chosen token's logprob and rank, and the k most likely tokens.

docs/sampling.md step 1: logprobs are ``log_softmax`` of the model output before any
processing. One program per row computes, with a working set of one block of logits (never a
``[num_rows, vocab_size]`` log_softmax), in passes over the row:

- ``max`` and ``sum(exp(x - max))`` (one pass, online rescaling);
- every logprob as ``(x - max) - log(sum)`` (torch's CPU ``log_softmax``);
- the chosen token's logprob and rank ``#{lp >= lp_t}`` (1 = most likely; vLLM's
  ``batched_count_greater_than`` counts ties against the token);
- the row's ``k`` largest logprobs by radix selection (``kernels/_select.py``), written in
  token-id order; the launcher then orders them by logprob (a stable sort of ``[rows, k]``,
  so ties stay with the lower id first).

Used for sampled-token logprobs (the chosen token is the sampled one) and for prompt logprobs
(the chosen token is the next prompt token), the latter over bounded chunks of positions.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_dtypes, check_matrix, check_vector
from turnout.kernels._select import _float_key, _radix_advance, _radix_candidates, vocab_block_size
from turnout.kernels._triton import require_triton, tl, triton


# 1 + max_k changes per step, and so do the pointers' alignments: a step's logprob rows come in
# chunks (runner_v2/sampler.py), and chunk c starts c * rows int32 words into token_ids and
# num_logprobs (6 rows for a 151,936-id vocabulary: 24 bytes, not 16); the outputs start one
# word into their rows, or are empty (null) when every k of the step is 0. One variant for
# all of them: each program loads one token and one k, and its stores are scattered anyway.
@triton.jit(  # type: ignore[untyped-decorator]
    do_not_specialize=["topk_stride"],
    do_not_specialize_on_alignment=[
        "token_ids_ptr",
        "num_logprobs_ptr",
        "topk_ids_ptr",
        "topk_logprobs_ptr",
    ],
)
def _topk_logprobs_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    logits_stride,
    token_ids_ptr,
    num_logprobs_ptr,
    topk_ids_ptr,
    topk_logprobs_ptr,
    topk_stride,
    token_logprobs_ptr,
    token_ranks_ptr,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    logits_row = logits_ptr + i.to(tl.int64) * logits_stride
    token = tl.load(token_ids_ptr + i)
    k = tl.load(num_logprobs_ptr + i)
    x_t = tl.load(logits_row + token)
    offs = tl.arange(0, BLOCK_SIZE)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab_size, BLOCK_SIZE):
        tok = start + offs
        x = tl.load(logits_row + tok, mask=tok < vocab_size, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # While everything seen is -inf, the running sum stays 0 (exp(-inf - -inf) is NaN).
        finite = m_new > float("-inf")
        alpha = tl.where(finite, tl.exp(m - m_new), 1.0)
        s = s * alpha + tl.where(finite, tl.sum(tl.exp(x - m_new), axis=0), 0.0)
        m = m_new
    log_s = tl.log(s)
    # Ranks and the top k compare logprobs, (x - max) - log(sum) as torch's log_softmax on
    # CPU computes them, so ties are those of the logprob values.
    lp_t = (x_t - m) - log_s
    tl.store(token_logprobs_ptr + i, lp_t)
    rank = tl.full([], 0, tl.int32)
    for start in range(0, vocab_size, BLOCK_SIZE):
        tok = start + offs
        mask = tok < vocab_size
        lp = (tl.load(logits_row + tok, mask=mask, other=float("-inf")) - m) - log_s
        rank += tl.sum(((lp >= lp_t) & mask).to(tl.int32), axis=0)
    tl.store(token_ranks_ptr + i, rank)
    if k > 0:
        threshold = tl.full([], 0, tl.int64)  # key of the k-th largest logprob
        # k >= vocab_size keeps every token: no selection needed (key 0 is below all keys).
        num_radix_passes = tl.where(k < vocab_size, 8, 0)
        for r in range(num_radix_passes):
            cand, shift = _radix_candidates(threshold, r)
            num_ge = tl.zeros([16], tl.int32)
            for start in range(0, vocab_size, BLOCK_SIZE):
                tok = start + offs
                mask = tok < vocab_size
                lp = (tl.load(logits_row + tok, mask=mask, other=float("-inf")) - m) - log_s
                ge = (_float_key(lp)[:, None] >= cand[None, :]) & mask[:, None]
                num_ge += tl.sum(ge.to(tl.int32), axis=0)
            threshold = _radix_advance(threshold, shift, num_ge >= k)
        num_gt = tl.full([], 0, tl.int32)
        num_count_passes = tl.where(k < vocab_size, 1, 0)  # all k: every token is above 0
        for start in range(0, vocab_size * num_count_passes, BLOCK_SIZE):
            tok = start + offs
            mask = tok < vocab_size
            lp = (tl.load(logits_row + tok, mask=mask, other=float("-inf")) - m) - log_s
            num_gt += tl.sum((mask & (_float_key(lp) > threshold)).to(tl.int32), axis=0)
        num_gt = tl.where(k < vocab_size, num_gt, vocab_size)
        # Gather in token-id order: every token above the threshold (fewer than k) into slots
        # 0.., then the lowest ids at the threshold into the slots left (the launcher orders).
        out_row = i.to(tl.int64) * topk_stride
        seen_gt = tl.full([], 0, tl.int32)
        seen_eq = tl.full([], 0, tl.int32)
        for start in range(0, vocab_size, BLOCK_SIZE):
            tok = start + offs
            mask = tok < vocab_size
            lp = (tl.load(logits_row + tok, mask=mask, other=float("-inf")) - m) - log_s
            key = _float_key(lp)
            gt = mask & (key > threshold)
            eq = mask & (key == threshold)
            slot = tl.where(
                gt,
                seen_gt + tl.cumsum(gt.to(tl.int32), axis=0) - 1,
                num_gt + seen_eq + tl.cumsum(eq.to(tl.int32), axis=0) - 1,
            )
            keep = (gt | eq) & (slot < k)
            tl.store(topk_ids_ptr + out_row + slot, tok, mask=keep)
            tl.store(topk_logprobs_ptr + out_row + slot, lp, mask=keep)
            seen_gt += tl.sum(gt.to(tl.int32), axis=0)
            seen_eq += tl.sum(eq.to(tl.int32), axis=0)


def topk_logprobs(
    logits: torch.Tensor,  # [num_rows, vocab_size] float32, raw model output
    token_ids: torch.Tensor,  # [num_rows] int32, the token whose logprob and rank are wanted
    num_logprobs: torch.Tensor,  # [num_rows] int32, k per row (0: only the token's)
    topk_ids_out: torch.Tensor,  # [num_rows, max_k] int32, first k of each row written
    topk_logprobs_out: torch.Tensor,  # [num_rows, max_k] float32, first k of each row written
    token_logprobs_out: torch.Tensor,  # [num_rows] float32
    token_ranks_out: torch.Tensor,  # [num_rows] int32, 1 = most likely
) -> None:
    """The chosen token's logprob and rank, and the ``k`` most likely tokens per row (Triton).

    ``max_k`` (the width of the outputs) is the largest ``k`` of the call; ``k`` may reach the
    vocabulary size. Working set: one block of logits per row in the kernel, then a sort of
    the ``[num_rows, max_k]`` result.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations.
    """
    require_triton()
    _check(
        logits,
        token_ids,
        num_logprobs,
        topk_ids_out,
        topk_logprobs_out,
        token_logprobs_out,
        token_ranks_out,
    )
    num_rows, vocab_size = logits.shape
    if num_rows == 0:
        return
    # Slots a row does not fill sort last (k varies per row).
    topk_logprobs_out.fill_(float("-inf"))
    _topk_logprobs_kernel[(num_rows,)](
        logits,
        logits.stride(0),
        token_ids,
        num_logprobs,
        topk_ids_out,
        topk_logprobs_out,
        topk_ids_out.stride(0),
        token_logprobs_out,
        token_ranks_out,
        vocab_size,
        BLOCK_SIZE=vocab_block_size(vocab_size, logits.device),
    )
    if topk_ids_out.shape[1] > 1:
        # The kernel wrote each row's k in token-id order; a stable sort by descending
        # logprob gives "most likely first, ties to the lower id" ([num_rows, max_k] only).
        values, order = torch.sort(topk_logprobs_out, dim=1, descending=True, stable=True)
        topk_ids_out.copy_(topk_ids_out.gather(1, order))
        topk_logprobs_out.copy_(values)


def topk_logprobs_ref(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    num_logprobs: torch.Tensor,
    topk_ids_out: torch.Tensor,
    topk_logprobs_out: torch.Tensor,
    token_logprobs_out: torch.Tensor,
    token_ranks_out: torch.Tensor,
) -> None:
    """Torch reference of :func:`topk_logprobs` (same arguments; a full log_softmax)."""
    _check(
        logits,
        token_ids,
        num_logprobs,
        topk_ids_out,
        topk_logprobs_out,
        token_logprobs_out,
        token_ranks_out,
    )
    if logits.shape[0] == 0:
        return
    logprobs = torch.log_softmax(logits, dim=-1)
    tok = token_ids.long().unsqueeze(1)
    chosen = logprobs.gather(1, tok)
    token_logprobs_out.copy_(chosen.squeeze(1))
    token_ranks_out.copy_((logprobs >= chosen).sum(dim=1).to(torch.int32))
    vocab = torch.arange(logits.shape[1], device=logits.device)
    for i, k in enumerate(num_logprobs.tolist()):
        # Stable sort by descending logit keeps ids ascending among ties.
        order = torch.sort(logprobs[i], descending=True, stable=True).indices[:k]
        topk_ids_out[i, :k] = vocab[order].to(torch.int32)
        topk_logprobs_out[i, :k] = logprobs[i, order]


def _check(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    num_logprobs: torch.Tensor,
    topk_ids_out: torch.Tensor,
    topk_logprobs_out: torch.Tensor,
    token_logprobs_out: torch.Tensor,
    token_ranks_out: torch.Tensor,
) -> None:
    check_matrix("logits", logits, torch.float32, "[num_rows, vocab_size]")
    n = logits.shape[0]
    check_vector("token_ids", token_ids, torch.int32, n)
    check_vector("num_logprobs", num_logprobs, torch.int32, n)
    check_vector("token_logprobs_out", token_logprobs_out, torch.float32, n)
    check_vector("token_ranks_out", token_ranks_out, torch.int32, n)
    check_dtypes(
        topk_ids_out=(topk_ids_out, torch.int32),
        topk_logprobs_out=(topk_logprobs_out, torch.float32),
    )
    if topk_ids_out.shape != topk_logprobs_out.shape or topk_ids_out.shape[0] != n:
        raise ValueError("topk outputs must both be [num_rows, max_k]")
    if topk_ids_out.stride() != topk_logprobs_out.stride() or topk_ids_out.stride(-1) != 1:
        raise ValueError("topk outputs must share strides with a unit inner stride")


__all__ = ["topk_logprobs", "topk_logprobs_ref"]
