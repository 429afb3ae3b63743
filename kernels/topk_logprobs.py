"""Logprobs from raw logits: a chosen token's logprob and rank, and the k most likely tokens.

docs/sampling.md step 1: logprobs are ``log_softmax`` of the model output before any
processing. One program per row computes, with a working set of one block of logits plus
``K_MAX`` candidates (never a ``[num_rows, vocab_size]`` log_softmax):

- ``lse`` as ``max + log(sum(exp(x - max)))`` (one pass, online rescaling);
- the chosen token's logprob ``x_t - max - log(sum)`` and rank ``#{x >= x_t}`` (1 = most likely;
  vLLM's ``batched_count_greater_than`` counts ties against the token);
- the row's ``k`` largest logits by radix selection (``kernels/_select.py``), gathered in
  token-id order, then ordered by logprob, ties to the lower id.

Used for sampled-token logprobs (the chosen token is the sampled one) and for prompt logprobs
(the chosen token is the next prompt token), the latter over bounded chunks of positions.
"""

from __future__ import annotations

import torch

from kernels._select import _float_key, _radix_advance, _radix_candidates
from kernels._triton import require_triton, tl, triton


@triton.jit
def _gather_slots(slot_ids, slot_vals, sel_pos, sel, tok, x, K_MAX: tl.constexpr):
    # Put the selected elements of a block into register slots: element b goes to slot
    # sel_pos[b] (positions are distinct among selected elements).
    slots = tl.arange(0, K_MAX)
    hit = sel[:, None] & (sel_pos[:, None] == slots[None, :])
    any_hit = tl.sum(hit.to(tl.int32), axis=0) > 0
    new_ids = tl.sum(tl.where(hit, tok[:, None], 0), axis=0)
    new_vals = tl.sum(tl.where(hit, x[:, None], 0.0), axis=0)
    return tl.where(any_hit, new_ids, slot_ids), tl.where(any_hit, new_vals, slot_vals)


@triton.jit
def _topk_logprobs_kernel(
    logits_ptr, logits_stride, token_ids_ptr, num_logprobs_ptr,
    topk_ids_ptr, topk_logprobs_ptr, topk_stride, token_logprobs_ptr, token_ranks_ptr,
    vocab_size, K_MAX: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    logits_row = logits_ptr + i.to(tl.int64) * logits_stride
    token = tl.load(token_ids_ptr + i)
    k = tl.load(num_logprobs_ptr + i)
    x_t = tl.load(logits_row + token)
    offs = tl.arange(0, BLOCK_SIZE)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    rank = tl.full([], 0, tl.int32)
    for start in range(0, vocab_size, BLOCK_SIZE):
        tok = start + offs
        mask = tok < vocab_size
        x = tl.load(logits_row + tok, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # While everything seen is -inf, the running sum stays 0 (exp(-inf - -inf) is NaN).
        finite = m_new > float("-inf")
        alpha = tl.where(finite, tl.exp(m - m_new), 1.0)
        s = s * alpha + tl.where(finite, tl.sum(tl.exp(x - m_new), axis=0), 0.0)
        m = m_new
        rank += tl.sum(((x >= x_t) & mask).to(tl.int32), axis=0)
    log_s = tl.log(s)
    tl.store(token_logprobs_ptr + i, (x_t - m) - log_s)
    tl.store(token_ranks_ptr + i, rank)
    if k > 0:
        threshold = tl.full([], 0, tl.int64)
        for r in range(8):
            cand, shift = _radix_candidates(threshold, r)
            num_ge = tl.zeros([16], tl.int32)
            for start in range(0, vocab_size, BLOCK_SIZE):
                tok = start + offs
                mask = tok < vocab_size
                x = tl.load(logits_row + tok, mask=mask, other=float("-inf"))
                ge = (_float_key(x)[:, None] >= cand[None, :]) & mask[:, None]
                num_ge += tl.sum(ge.to(tl.int32), axis=0)
            threshold = _radix_advance(threshold, shift, num_ge >= k)
        # Above the threshold: fewer than k tokens, all taken. At it: the lowest ids fill the rest.
        gt_ids = tl.zeros([K_MAX], tl.int32)
        gt_vals = tl.zeros([K_MAX], tl.float32)
        eq_ids = tl.zeros([K_MAX], tl.int32)
        eq_vals = tl.zeros([K_MAX], tl.float32)
        num_gt = tl.full([], 0, tl.int32)
        num_eq = tl.full([], 0, tl.int32)
        for start in range(0, vocab_size, BLOCK_SIZE):
            tok = start + offs
            mask = tok < vocab_size
            x = tl.load(logits_row + tok, mask=mask, other=float("-inf"))
            key = _float_key(x)
            gt = mask & (key > threshold)
            eq = mask & (key == threshold)
            gt_pos = num_gt + tl.cumsum(gt.to(tl.int32), axis=0) - 1
            eq_pos = num_eq + tl.cumsum(eq.to(tl.int32), axis=0) - 1
            gt_ids, gt_vals = _gather_slots(gt_ids, gt_vals, gt_pos, gt, tok, x, K_MAX)
            eq_ids, eq_vals = _gather_slots(eq_ids, eq_vals, eq_pos, eq & (eq_pos < K_MAX), tok, x, K_MAX)
            num_gt += tl.sum(gt.to(tl.int32), axis=0)
            num_eq += tl.sum(eq.to(tl.int32), axis=0)
        # Order the tokens above the threshold by (logit desc, id asc); those at it follow.
        slots = tl.arange(0, K_MAX)
        valid = slots < num_gt
        before = (gt_vals[None, :] > gt_vals[:, None]) | (
            (gt_vals[None, :] == gt_vals[:, None]) & (gt_ids[None, :] < gt_ids[:, None])
        )
        order = tl.sum((before & valid[None, :]).to(tl.int32), axis=1)  # slot of gt element j
        dest_gt = tl.where(valid, order, -1)
        dest_eq = num_gt + slots
        pick_gt = dest_gt[None, :] == slots[:, None]  # [slot, j]
        pick_eq = dest_eq[None, :] == slots[:, None]
        out_ids = tl.sum(tl.where(pick_gt, gt_ids[None, :], 0), axis=1) + tl.sum(
            tl.where(pick_eq, eq_ids[None, :], 0), axis=1)
        out_vals = tl.sum(tl.where(pick_gt, gt_vals[None, :], 0.0), axis=1) + tl.sum(
            tl.where(pick_eq, eq_vals[None, :], 0.0), axis=1)
        out_mask = slots < k
        out_row = i.to(tl.int64) * topk_stride + slots
        tl.store(topk_ids_ptr + out_row, out_ids, mask=out_mask)
        tl.store(topk_logprobs_ptr + out_row, (out_vals - m) - log_s, mask=out_mask)


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

    ``max_k`` (the width of the outputs) is the largest ``k`` of the call, at most 1024.

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations.
    """
    require_triton()
    _check(logits, token_ids, num_logprobs, topk_ids_out, topk_logprobs_out, token_logprobs_out, token_ranks_out)
    num_rows, vocab_size = logits.shape
    if num_rows == 0:
        return
    k_max = triton.next_power_of_2(max(topk_ids_out.shape[1], 1))
    # Wide candidate sets get narrower blocks: the gather works on [BLOCK_SIZE, K_MAX].
    block_size = max(64, min(1024, 16384 // k_max))
    _topk_logprobs_kernel[(num_rows,)](
        logits, logits.stride(0), token_ids, num_logprobs, topk_ids_out, topk_logprobs_out,
        topk_ids_out.stride(0), token_logprobs_out, token_ranks_out, vocab_size,
        K_MAX=k_max, BLOCK_SIZE=block_size,
    )


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
    _check(logits, token_ids, num_logprobs, topk_ids_out, topk_logprobs_out, token_logprobs_out, token_ranks_out)
    if logits.shape[0] == 0:
        return
    logprobs = torch.log_softmax(logits, dim=-1)
    tok = token_ids.long().unsqueeze(1)
    chosen = logits.gather(1, tok)
    token_logprobs_out.copy_(logprobs.gather(1, tok).squeeze(1))
    token_ranks_out.copy_((logits >= chosen).sum(dim=1).to(torch.int32))
    vocab = torch.arange(logits.shape[1], device=logits.device)
    for i, k in enumerate(num_logprobs.tolist()):
        # Stable sort by descending logit keeps ids ascending among ties.
        order = torch.sort(logits[i], descending=True, stable=True).indices[:k]
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
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("logits must be [num_rows, vocab_size] float32 with unit inner stride")
    n = logits.shape[0]
    for name, t, dtype in (
        ("token_ids", token_ids, torch.int32), ("num_logprobs", num_logprobs, torch.int32),
        ("token_logprobs_out", token_logprobs_out, torch.float32),
        ("token_ranks_out", token_ranks_out, torch.int32),
    ):
        if t.dtype != dtype or t.shape != (n,):
            raise ValueError(f"{name} must be [{n}] {dtype}, got {tuple(t.shape)} {t.dtype}")
    if topk_ids_out.dtype != torch.int32 or topk_logprobs_out.dtype != torch.float32:
        raise ValueError("topk_ids_out must be int32 and topk_logprobs_out float32")
    if topk_ids_out.shape != topk_logprobs_out.shape or topk_ids_out.shape[0] != n:
        raise ValueError("topk outputs must both be [num_rows, max_k]")
    if topk_ids_out.stride() != topk_logprobs_out.stride() or topk_ids_out.stride(-1) != 1:
        raise ValueError("topk outputs must share strides with a unit inner stride")
    if topk_ids_out.shape[1] > 1024:
        raise ValueError(f"max_k={topk_ids_out.shape[1]} is above the kernel's bound of 1024")


__all__ = ["topk_logprobs", "topk_logprobs_ref"]
