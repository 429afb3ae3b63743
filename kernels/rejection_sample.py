"""Rejection sampling: which draft tokens a verification step accepts, and the token after them.

Request ``i`` verified ``num_drafts[i]`` drafts ``d_0..d_{n-1}``; the target scored its
``n + 1`` positions in one forward (target rows ``cu_num_rows[i] + j``, ``j <= n``; row ``j``
decides the token at ``row_positions[...]``, the position of ``d_j``). Walking ``j = 0, 1, ...``:

- **greedy** rows (temperature 0): ``d_j`` is accepted when it equals the target's argmax at
  row ``j`` (``target_sampled``); the first mismatch is replaced by that argmax. The output is
  exactly greedy decoding's.
- **sampled** rows: the standard rule (Leviathan et al. 2023, "Fast Inference from Transformers
  via Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
  Speculative Sampling"): accept ``d_j`` when ``u * q(d_j) < p(d_j)``, i.e. with probability
  ``min(1, p/q)``; on the first rejection draw the replacement from ``norm(max(p - q, 0))``.
  ``p`` is the target's processed distribution at row ``j`` and ``q`` the draft's
  (``kernels/sampling_probs.py``); a proposer without a distribution (n-gram) has the one-hot
  ``q`` of its token (``draft_probs=None``). The output is distributed as sampling from ``p``.
- after ``n`` accepted drafts the bonus token is the target's own sample at row ``n``
  (``target_sampled``: argmax, or the Gumbel-max draw from ``p`` with the ordinary noise).

The noise is turnout's stateless hash (``kernels/gumbel_noise.py``) of the request's seed and
the position being decided: the acceptance uniform is the draw ``ACCEPT_DRAW`` at that position,
the residual's Gumbel noise the stream ``RESIDUAL_STREAM``; so a seeded request repeats
exactly, whatever it is batched with. Outputs: ``output_token_ids[i, :a + 1]`` (``a`` accepted
drafts, then the replacement or bonus; ``-1`` after) and ``num_sampled[i] = a + 1``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_at_least, check_dtypes, check_flat, check_matrix
from turnout.kernels._select import _argmax_update, vocab_block_size
from turnout.kernels._triton import require_triton, tl, triton
from turnout.kernels.gumbel_noise import (
    ACCEPT_DRAW,
    RESIDUAL_STREAM,
    _gumbel_from_hash,
    _row_hash,
    _uniform_from_hash,
    gumbel_noise_ref,
    uniform_noise_ref,
)


@triton.jit  # type: ignore[untyped-decorator]
def _residual_sample(  # type: ignore[no-untyped-def]
    target_row,
    draft_row,
    draft_token,
    row_h,
    vocab_size,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # argmax over tokens of log(max(p - q, 0)) + Gumbel noise: a draw from norm(max(p - q, 0));
    # -inf when the residual is empty (p == q: a rejection then only comes from rounding).
    offs = tl.arange(0, BLOCK_SIZE)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for start in range(0, vocab_size, BLOCK_SIZE):
        tok = start + offs
        mask = tok < vocab_size
        p = tl.load(target_row + tok, mask=mask, other=0.0)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_row + tok, mask=mask, other=0.0)
        else:
            q = tl.where(tok == draft_token, 1.0, 0.0)
        r = tl.maximum(p - q, 0.0)
        v = tl.where(
            mask & (r > 0.0),
            tl.log(tl.where(r > 0.0, r, 1.0)) + _gumbel_from_hash(row_h, tok),
            float("-inf"),
        )
        best_val, best_idx = _argmax_update(v, tok, best_val, best_idx)
    return best_val, best_idx


@triton.jit  # type: ignore[untyped-decorator]
def _rejection_sample_kernel(  # type: ignore[no-untyped-def]
    cu_num_rows_ptr,
    idx_mapping_ptr,
    num_drafts_ptr,
    drafts_ptr,
    drafts_stride,
    target_sampled_ptr,
    row_positions_ptr,
    target_probs_ptr,
    target_probs_stride,
    draft_probs_ptr,
    draft_probs_stride_req,
    draft_probs_stride_draft,
    temperature_ptr,
    temperature_stride,
    seed_ptr,
    seed_stride,
    out_ptr,
    out_stride,
    num_sampled_ptr,
    vocab_size,
    MAX_DRAFTS: tl.constexpr,
    OUT_BLOCK: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    ACCEPT: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    r0 = tl.load(cu_num_rows_ptr + i)
    nd = tl.load(num_drafts_ptr + i)
    greedy = tl.load(temperature_ptr + row * temperature_stride) == 0.0
    if not HAS_PROBS:
        greedy = nd >= 0  # every row is verified by argmax
    seed = tl.load(seed_ptr + row * seed_stride)
    num_accepted = tl.full([], 0, tl.int32)
    rejected = num_accepted != 0
    final = tl.load(target_sampled_ptr + r0 + nd)  # the bonus token, unless a draft is rejected
    for j in tl.static_range(MAX_DRAFTS):
        if (j < nd) & (~rejected):
            d = tl.load(drafts_ptr + i * drafts_stride + j)
            rr = (r0 + j).to(tl.int64)
            pos = tl.load(row_positions_ptr + rr).to(tl.int64)
            target_row = target_probs_ptr + rr * target_probs_stride
            draft_row = draft_probs_ptr + i * draft_probs_stride_req + j * draft_probs_stride_draft
            if greedy:
                ok = d == tl.load(target_sampled_ptr + rr)
            else:
                p = tl.load(target_row + d)
                q = tl.load(draft_row + d) if HAS_DRAFT_PROBS else 1.0
                u = _uniform_from_hash(_row_hash(seed, pos), tl.full([], ACCEPT, tl.int64))
                ok = u * q < p
            if ok:
                num_accepted += 1
            else:
                rejected = num_accepted >= 0
                if greedy:
                    final = tl.load(target_sampled_ptr + rr)
                else:
                    val, idx = _residual_sample(
                        target_row,
                        draft_row,
                        d,
                        _row_hash(seed, pos + RESIDUAL),
                        vocab_size,
                        HAS_DRAFT_PROBS,
                        BLOCK_SIZE,
                    )
                    final = tl.where(val > float("-inf"), idx, tl.load(target_sampled_ptr + rr))
    j = tl.arange(0, OUT_BLOCK)
    drafts = tl.load(drafts_ptr + i * drafts_stride + j, mask=j < MAX_DRAFTS, other=-1)
    out = tl.where(j < num_accepted, drafts, tl.where(j == num_accepted, final, -1))
    tl.store(out_ptr + i * out_stride + j, out, mask=j < MAX_DRAFTS + 1)
    tl.store(num_sampled_ptr + i, num_accepted + 1)


def rejection_sample(
    cu_num_rows: torch.Tensor,  # [num_reqs + 1] int32: target rows of request i: cu[i]..cu[i+1]-1
    idx_mapping: torch.Tensor,  # [num_reqs] int32, batch position -> table row
    num_drafts: torch.Tensor,  # [num_reqs] int32, drafts to verify (<= its rows - 1)
    draft_token_ids: torch.Tensor,  # [num_reqs, max_num_drafts] int32
    target_sampled: torch.Tensor,  # [num_rows] int32: argmax (greedy) or the sampler's draw per row
    row_positions: torch.Tensor,  # [num_rows] int32: the position each target row decides
    target_probs: torch.Tensor | None,  # [num_rows, vocab_size] float32; None: every row greedy
    draft_probs: torch.Tensor
    | None,  # [num_reqs, max_num_drafts, vocab_size] float32; None: one-hot
    temperature: torch.Tensor,  # [max_num_seqs] float32 (any stride), 0 = greedy
    seed: torch.Tensor,  # [max_num_seqs] int64 (any stride)
    output_token_ids: torch.Tensor,  # [num_reqs, max_num_drafts + 1] int32, written
    num_sampled: torch.Tensor,  # [num_reqs] int32, written: accepted drafts + 1
) -> None:
    """Accept a prefix of each request's drafts and append one token (Triton; see the module
    docstring). ``target_probs=None`` treats every row as greedy (no row is sampled).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes, shapes or strides do not match the annotations.
    """
    require_triton()
    _check(
        cu_num_rows,
        idx_mapping,
        num_drafts,
        draft_token_ids,
        target_sampled,
        row_positions,
        target_probs,
        draft_probs,
        temperature,
        seed,
        output_token_ids,
        num_sampled,
    )
    num_reqs, max_drafts = draft_token_ids.shape
    if num_reqs == 0:
        return
    vocab_size = target_probs.shape[1] if target_probs is not None else 1
    probs = (
        target_probs if target_probs is not None else target_sampled
    )  # never read without HAS_PROBS
    dprobs = draft_probs if draft_probs is not None else probs
    dstride = (dprobs.stride(0), dprobs.stride(1)) if draft_probs is not None else (0, 0)
    _rejection_sample_kernel[(num_reqs,)](
        cu_num_rows,
        idx_mapping,
        num_drafts,
        draft_token_ids,
        draft_token_ids.stride(0),
        target_sampled,
        row_positions,
        probs,
        probs.stride(0),
        dprobs,
        dstride[0],
        dstride[1],
        temperature,
        temperature.stride(0),
        seed,
        seed.stride(0),
        output_token_ids,
        output_token_ids.stride(0),
        num_sampled,
        vocab_size,
        MAX_DRAFTS=max_drafts,
        OUT_BLOCK=triton.next_power_of_2(max_drafts + 1),
        HAS_PROBS=target_probs is not None,
        HAS_DRAFT_PROBS=draft_probs is not None,
        ACCEPT=ACCEPT_DRAW,
        RESIDUAL=RESIDUAL_STREAM,
        BLOCK_SIZE=vocab_block_size(vocab_size, draft_token_ids.device),
    )


def rejection_sample_ref(
    cu_num_rows: torch.Tensor,
    idx_mapping: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_sampled: torch.Tensor,
    row_positions: torch.Tensor,
    target_probs: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_sampled: torch.Tensor,
) -> None:
    """Torch reference of :func:`rejection_sample` (same arguments; one request at a time)."""
    _check(
        cu_num_rows,
        idx_mapping,
        num_drafts,
        draft_token_ids,
        target_sampled,
        row_positions,
        target_probs,
        draft_probs,
        temperature,
        seed,
        output_token_ids,
        num_sampled,
    )
    output_token_ids.fill_(-1)
    for i, row in enumerate(idx_mapping.tolist()):
        r0, nd = int(cu_num_rows[i]), int(num_drafts[i])
        greedy = target_probs is None or float(temperature[row]) == 0.0
        drafts = draft_token_ids[i].tolist()
        accepted, final = 0, int(target_sampled[r0 + nd])
        for j in range(nd):
            d, rr = drafts[j], r0 + j
            if greedy:
                if d == int(target_sampled[rr]):
                    accepted += 1
                    continue
                final = int(target_sampled[rr])
                break
            assert target_probs is not None
            if _accepts(
                target_probs[rr],
                None if draft_probs is None else draft_probs[i, j],
                d,
                seed[row : row + 1],
                int(row_positions[rr]),
            ):
                accepted += 1
                continue
            final = _residual_ref(
                target_probs[rr],
                None if draft_probs is None else draft_probs[i, j],
                d,
                seed[row : row + 1],
                int(row_positions[rr]),
                int(target_sampled[rr]),
            )
            break
        output_token_ids[i, :accepted] = draft_token_ids[i, :accepted]
        output_token_ids[i, accepted] = final
        num_sampled[i] = accepted + 1


def _accepts(p: torch.Tensor, q: torch.Tensor | None, d: int, seed: torch.Tensor, pos: int) -> bool:
    positions = torch.tensor([pos], dtype=torch.int64, device=p.device)
    u = uniform_noise_ref(
        seed, positions, torch.tensor([[ACCEPT_DRAW]], dtype=torch.int64, device=p.device)
    )
    qd = float(q[d]) if q is not None else 1.0
    return bool(u[0, 0] * qd < p[d])


def _residual_ref(
    p: torch.Tensor, q: torch.Tensor | None, d: int, seed: torch.Tensor, pos: int, fallback: int
) -> int:
    if q is None:
        q = torch.zeros_like(p)
        q[d] = 1.0
    r = torch.clamp(p - q, min=0.0)
    positions = torch.tensor([pos + RESIDUAL_STREAM], dtype=torch.int64, device=p.device)
    g = gumbel_noise_ref(seed, positions, p.shape[0])[0]
    v = torch.where(r > 0, torch.log(r) + g, torch.full_like(r, float("-inf")))
    return int(torch.argmax(v)) if bool((r > 0).any()) else fallback


def _check(
    cu_num_rows: torch.Tensor,
    idx_mapping: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_sampled: torch.Tensor,
    row_positions: torch.Tensor,
    target_probs: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_sampled: torch.Tensor,
) -> None:
    i32 = torch.int32
    check_dtypes(
        cu_num_rows=(cu_num_rows, i32),
        idx_mapping=(idx_mapping, i32),
        num_drafts=(num_drafts, i32),
        target_sampled=(target_sampled, i32),
        row_positions=(row_positions, i32),
        temperature=(temperature, torch.float32),
        seed=(seed, torch.int64),
        num_sampled=(num_sampled, i32),
    )
    check_flat(
        cu_num_rows=cu_num_rows,
        idx_mapping=idx_mapping,
        num_drafts=num_drafts,
        target_sampled=target_sampled,
        row_positions=row_positions,
        num_sampled=num_sampled,
    )
    check_matrix("draft_token_ids", draft_token_ids, i32, "[num_reqs, max_num_drafts]")
    num_reqs, max_drafts = draft_token_ids.shape
    check_matrix(
        "output_token_ids",
        output_token_ids,
        i32,
        "[num_reqs, max_num_drafts + 1]",
        num_reqs,
        max_drafts + 1,
    )
    check_at_least(
        num_reqs,
        "num_reqs",
        idx_mapping=idx_mapping,
        num_drafts=num_drafts,
        num_sampled=num_sampled,
    )
    check_at_least(num_reqs + 1, "num_reqs + 1", cu_num_rows=cu_num_rows)
    check_at_least(target_sampled.shape[0], "num_rows", row_positions=row_positions)
    if target_probs is not None:
        check_matrix(
            "target_probs",
            target_probs,
            torch.float32,
            "[num_rows, vocab_size]",
            target_sampled.shape[0],
        )
    if draft_probs is not None:
        if target_probs is None:
            raise ValueError("draft_probs need target_probs: only sampled rows read them")
        shape = (num_reqs, max_drafts, target_probs.shape[1])
        if (
            draft_probs.dtype != torch.float32
            or tuple(draft_probs.shape) != shape
            or draft_probs.stride(2) != 1
        ):
            raise ValueError(
                f"draft_probs must be {list(shape)} float32 with unit inner stride, got "
                f"{tuple(draft_probs.shape)} {draft_probs.dtype}, strides {draft_probs.stride()}"
            )


__all__ = ["rejection_sample", "rejection_sample_ref"]
