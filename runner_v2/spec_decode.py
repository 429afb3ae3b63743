"""Speculative decoding on runner_v2 (docs/architecture.md §5.4): the host plan of a speculative
step, the GPU n-gram proposer, and verification, all without a host synchronisation.

A step verifies, for each decoding request with ``s`` drafts scheduled (``s <= k``; the
scheduler reserves the positions, it never sees the drafts), ``1 + s`` positions in one target
forward: its last sampled token and the drafts, which the proposer wrote into the token table
after the request's tokens (``kernels/ngram_propose.py`` for ``ngram_gpu``,
``runner_v2/draft_model.py`` for ``draft_model``). Each verified position is one *target row*:
the sampler runs on every row (argmax, or the Gumbel-max draw with the request's parameters at
that row's position: the bonus token), the processed distributions ``p`` are written out for
sampled requests, and ``kernels/rejection_sample.py`` accepts a prefix of the drafts.
``kernels/spec_post_update.py`` then appends the accepted tokens and advances
``num_computed_tokens`` by them alone: a rejected draft's KV slot is written again by the next
step, at the same position. The accepted counts stay on the device; the host learns them with
the step's results (``AsyncOutput``), one step later, and its mirrors of the counters are the
scheduler's optimistic ones until then (every scheduled draft counted as accepted: an upper
bound, which is all the host sizes anything by).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnout.engine.config import SpeculativeConfig
from turnout.kernels.ngram_propose import ngram_propose
from turnout.kernels.rejection_sample import rejection_sample
from turnout.kernels.spec_post_update import post_update_spec


@dataclass(frozen=True)
class SpecStepPlan:
    """The host side of a step with speculation configured (numpy, batch order).

    Attributes:
        num_spec: ``[n] int32`` drafts scheduled per request (the last of its tokens).
        decode: ``[n] bool`` requests decoding (their step starts at their last sampled token):
            a draft model proposes for these; the others prefill (a prompt chunk, a resume).
        cu_rows: ``[n + 1] int32`` target rows per request: ``1 + num_spec``.
        logits_indices: ``[num_rows] int64`` the step's token of each target row.
        row_req: ``[num_rows] int32`` the batch position of each target row.
        k: ``num_speculative_tokens``.
    """

    num_spec: np.ndarray
    decode: np.ndarray
    cu_rows: np.ndarray
    logits_indices: np.ndarray
    row_req: np.ndarray
    k: int

    @property
    def max_spec(self) -> int:
        return int(self.num_spec.max(initial=0))

    @property
    def num_rows(self) -> int:
        return int(self.cu_rows[-1])

    @property
    def uniform(self) -> bool:
        """Every request verifies ``k`` drafts: ``1 + k`` tokens each (a CUDA-graph shape)."""
        return bool(self.num_spec.size) and bool((self.num_spec == self.k).all())

    @property
    def has_prefill(self) -> bool:
        return not bool(self.decode.all())

    def logprob_rows(self, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For the requests with logprobs (``ks >= 0``, by batch position): their batch positions,
        then per target row of theirs the row, its cell in the ``[n, k + 1]`` output and its k."""
        wanted = np.flatnonzero(ks >= 0)
        per = (self.cu_rows[1:] - self.cu_rows[:-1])[wanted]
        rows = _ranges(self.cu_rows[wanted], per)
        cells = _ranges(wanted * (self.k + 1), per)
        return wanted, rows, cells, np.repeat(ks[wanted], per).astype(np.int32)


def plan_spec_step(
    req_ids: list[str],
    spec_tokens: dict[str, list[int]],
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
    num_prompt: np.ndarray,
    query_start_loc: np.ndarray,
    k: int,
) -> SpecStepPlan:
    """The step's plan from the scheduler output (``scheduled_spec_decode_tokens``) and the
    host mirrors by batch position (``num_computed`` before the step, an upper bound)."""
    num_spec = np.asarray([len(spec_tokens.get(r, ())) for r in req_ids], np.int32)
    decode = (num_computed >= num_prompt) & (num_scheduled - num_spec == 1)
    per = 1 + num_spec
    cu = np.zeros(len(req_ids) + 1, np.int32)
    np.cumsum(per, out=cu[1:])
    first = query_start_loc[:-1].astype(np.int64) + num_scheduled - per  # the last sampled token's
    row_req = np.repeat(np.arange(len(req_ids), dtype=np.int32), per)
    return SpecStepPlan(num_spec, decode, cu, _ranges(first, per), row_req, k)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    # [starts[0], ..., starts[0] + counts[0] - 1, starts[1], ...] as int64
    total = int(counts.sum())
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    ranges: np.ndarray = np.repeat(np.asarray(starts, np.int64), counts) + offsets
    return ranges


def propose_ngram(
    spec: SpeculativeConfig,
    idx_mapping: torch.Tensor,
    num_spec: torch.Tensor,
    num_tokens: torch.Tensor,
    token_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ngram_gpu``: drafts from each request's own tokens, written into the table
    (``kernels/ngram_propose.py``). Returns ``(drafts [n, k] int32, num_drafts [n] int32)``:
    a request whose history has no match verifies fewer drafts (possibly none) than scheduled."""
    n = idx_mapping.shape[0]
    drafts = torch.empty(
        n, spec.num_speculative_tokens, dtype=torch.int32, device=idx_mapping.device
    )
    num_drafts = torch.empty(n, dtype=torch.int32, device=idx_mapping.device)
    ngram_propose(
        idx_mapping,
        num_spec,
        num_tokens,
        token_ids,
        spec.prompt_lookup_min,
        spec.prompt_lookup_max,
        drafts,
        num_drafts,
    )
    return drafts, num_drafts


def by_position(values: torch.Tensor, positions: torch.Tensor, n: int, fill: float) -> torch.Tensor:
    """``values`` (``[m, ...]``, of the batch positions ``positions``) as ``[n, ...]`` in batch
    order, ``fill`` elsewhere (a draft model proposes for the decoding requests only)."""
    if values.shape[0] == n:
        return values  # every request decodes: positions is 0..n-1
    out = torch.full((n, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
    return out.index_copy_(0, positions, values)


@dataclass(frozen=True)
class Verification:
    """Inputs of a verification beyond the target's rows (device tensors)."""

    idx_mapping: torch.Tensor  # [n] int32
    num_scheduled: torch.Tensor  # [n] int32
    num_spec: torch.Tensor  # [n] int32
    seq_lens: torch.Tensor  # [>= n] int32, as scheduled
    cu_rows: torch.Tensor  # [n + 1] int32
    drafts: torch.Tensor  # [n, k] int32
    num_drafts: torch.Tensor  # [n] int32, drafts proposed (<= num_spec)
    draft_probs: torch.Tensor | None  # [n, k, vocab] float32 (draft model, sampled requests)


def verify(
    v: Verification,
    target_sampled: torch.Tensor,
    row_positions: torch.Tensor,
    target_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    counters: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    token_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of each request's drafts and update the table (``counters``: the
    num_computed, num_tokens, last_sampled, num_drafts and num_accepted columns). Returns
    ``(tokens [n, k + 1] int32, num_sampled [n] int32)``: fresh tensors, read by the async copy."""
    n, k = v.drafts.shape
    tokens = torch.empty(n, k + 1, dtype=torch.int32, device=v.drafts.device)
    num_sampled = torch.empty(n, dtype=torch.int32, device=v.drafts.device)
    num_drafts = torch.minimum(v.num_drafts, v.num_spec)
    rejection_sample(
        v.cu_rows,
        v.idx_mapping,
        num_drafts,
        v.drafts,
        target_sampled,
        row_positions,
        target_probs,
        v.draft_probs if target_probs is not None else None,
        temperature,
        seed,
        tokens,
        num_sampled,
    )
    post_update_spec(
        v.idx_mapping,
        v.num_scheduled,
        v.num_spec,
        v.seq_lens,
        tokens,
        num_sampled,
        num_drafts,
        *counters,
        token_ids,
    )
    return tokens, num_sampled


def upload_arrays(sp: SpecStepPlan, rows: np.ndarray, ks: np.ndarray) -> list[np.ndarray]:
    """The host arrays of ``runner_v2.uploads.SpecUploads``, in its field order."""
    decode = np.flatnonzero(sp.decode)
    _, lp_rows, lp_cells, lp_k = sp.logprob_rows(ks)
    return [
        sp.num_spec,
        sp.cu_rows,
        sp.logits_indices,
        sp.row_req,
        decode.astype(np.int64),
        rows[decode],
        lp_rows,
        lp_cells,
        lp_k,
    ]


__all__ = [
    "SpecStepPlan",
    "Verification",
    "by_position",
    "plan_spec_step",
    "propose_ngram",
    "upload_arrays",
    "verify",
]
