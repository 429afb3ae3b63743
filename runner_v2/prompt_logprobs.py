"""Which prompt positions a step scores for prompt logprobs (docs/sampling.md step 1).

The hidden state at prompt position ``p`` scores prompt token ``p + 1``. A step scores the
prompt positions it schedules, for the requests that asked; the sampler computes them in
bounded chunks (``runner_v2/sampler.py``). Each request's range is delivered as one
``PromptLogprobs`` (``start = first position + 1``); a request preempted mid-prompt recomputes
its range and the engine keeps the first delivery of each token. Host side only: this plans
index arrays from the scheduler output and the table's host mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PromptLogprobsPlan:
    """The prompt positions a step scores, flattened over requests (host side).

    Attributes:
        req_ids: requests with prompt positions this step, in batch order.
        starts: ``[num]`` first prompt token scored per request (``>= 1``).
        counts: ``[num]`` positions per request.
        hidden_rows: ``[total] int64`` token index in the step of each position.
        target_flat: ``[total] int64`` flat index in the token table of each target token.
        num_logprobs: ``[total] int32`` k of each position's request.
    """

    req_ids: list[str]
    starts: np.ndarray
    counts: np.ndarray
    hidden_rows: np.ndarray
    target_flat: np.ndarray
    num_logprobs: np.ndarray

    @property
    def total(self) -> int:
        return int(self.hidden_rows.shape[0])

    @property
    def max_k(self) -> int:
        return int(self.num_logprobs.max(initial=0))


def plan_prompt_logprobs(
    req_ids: list[str],
    rows: np.ndarray,  # [num_reqs] table row per batch position
    num_computed: np.ndarray,  # [num_reqs] before the step
    num_scheduled: np.ndarray,  # [num_reqs]
    query_start_loc: np.ndarray,  # [num_reqs + 1]
    num_prompt_tokens_np: np.ndarray,  # [max_num_seqs] per row
    num_prompt_logprobs_np: np.ndarray,  # [max_num_seqs] per row, -1 = not asked
    max_model_len: int,
) -> PromptLogprobsPlan | None:
    """Which prompt positions this step scores, or ``None`` when no request asks."""
    ks = num_prompt_logprobs_np[rows]
    firsts = num_computed
    lasts = np.minimum(num_computed + num_scheduled, num_prompt_tokens_np[rows] - 1)
    wanted = np.flatnonzero((ks >= 0) & (lasts > firsts))
    if wanted.size == 0:
        return None
    counts = (lasts - firsts)[wanted]
    # Position j of request i: hidden row query_start_loc[i] + j, target (row, first + 1 + j).
    owner = np.repeat(wanted, counts)
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    return PromptLogprobsPlan(
        req_ids=[req_ids[i] for i in wanted],
        starts=firsts[wanted] + 1,
        counts=counts,
        hidden_rows=query_start_loc[owner].astype(np.int64) + offsets,
        target_flat=rows[owner].astype(np.int64) * max_model_len + firsts[owner] + 1 + offsets,
        num_logprobs=ks[owner].astype(np.int32),
    )


__all__ = ["PromptLogprobsPlan", "plan_prompt_logprobs"]
