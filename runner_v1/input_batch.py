"""The persistent batch of runner_v1 (MRV1 style): numpy tables whose rows are the batch order.

Every per-request field lives in a ``[max_num_seqs, ...]`` numpy array. A request gets a row
when it is (re)scheduled; removing it leaves a hole; :meth:`InputBatch.condense` moves the last
rows into the holes so that rows ``0..num_reqs-1`` are the batch. ``add_request`` writes
*every* field of its row, so a reused row carries nothing from its previous request
(docs/architecture.md §5.5). The token table is ``[max_num_seqs, max_model_len]``: the CPU keeps
each request's whole history, which n-gram speculation and penalties read.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_NO_LOGPROBS = -1


@dataclass
class RequestView:
    """What the batch needs to know about a request when it takes a row."""

    req_id: str
    token_ids: Sequence[int]  # prompt + output so far
    num_prompt_tokens: int
    num_computed_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logits_processors: tuple[Callable[..., Any], ...] = field(default=())


class InputBatch:
    """Rows ``0..num_reqs-1`` (after :meth:`condense`) are the requests of the step.

    Args:
        max_num_seqs: rows.
        max_model_len: columns of the token table.
    """

    def __init__(self, max_num_seqs: int, max_model_len: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.req_ids: list[str | None] = [None] * max_num_seqs
        self.req_id_to_row: dict[str, int] = {}
        self._holes: list[int] = []  # min-heap of empty rows below _num_rows
        self._num_rows = 0  # high-water mark of used rows
        n = max_num_seqs
        self.token_ids_np = np.zeros((n, max_model_len), np.int32)
        self.num_tokens_np = np.zeros(n, np.int32)  # prompt + output (drafts excluded)
        self.num_prompt_tokens_np = np.zeros(n, np.int32)
        self.num_computed_tokens_np = np.zeros(n, np.int32)
        self.temperature_np = np.zeros(n, np.float32)
        self.top_p_np = np.ones(n, np.float32)
        self.top_k_np = np.full(n, -1, np.int32)
        self.min_p_np = np.zeros(n, np.float32)
        self.seeds_np = np.zeros(n, np.int64)
        self.presence_penalty_np = np.zeros(n, np.float32)
        self.frequency_penalty_np = np.zeros(n, np.float32)
        self.repetition_penalty_np = np.ones(n, np.float32)
        self.min_tokens_np = np.zeros(n, np.int32)
        self.ignore_eos_np = np.zeros(n, np.bool_)
        self.num_logprobs_np = np.full(n, _NO_LOGPROBS, np.int32)
        self.num_prompt_logprobs_np = np.full(n, _NO_LOGPROBS, np.int32)
        self.stop_token_ids: list[tuple[int, ...]] = [()] * n
        self.logits_processors: list[tuple[Callable[..., Any], ...]] = [()] * n

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_row)

    def add_request(self, view: RequestView) -> int:
        """Give the request a row (the lowest hole, else the next row) and fill all of it.

        Raises:
            ValueError: no row is free, the id is already in the batch, or the tokens do not
                fit ``max_model_len``.
        """
        if view.req_id in self.req_id_to_row:
            raise ValueError(f"request {view.req_id} is already in the batch")
        if len(view.token_ids) > self.max_model_len:
            raise ValueError(
                f"request {view.req_id} has {len(view.token_ids)} tokens > {self.max_model_len}"
            )
        if self._holes:
            row = heapq.heappop(self._holes)
        elif self._num_rows < self.max_num_seqs:
            row = self._num_rows
            self._num_rows += 1
        else:
            raise ValueError(f"the batch is full ({self.max_num_seqs} rows)")
        self.req_ids[row] = view.req_id
        self.req_id_to_row[view.req_id] = row
        self._fill(row, view)
        return row

    def _fill(self, row: int, v: RequestView) -> None:
        n = len(v.token_ids)
        self.token_ids_np[row, :n] = v.token_ids
        self.token_ids_np[row, n:] = 0
        self.num_tokens_np[row] = n
        self.num_prompt_tokens_np[row] = v.num_prompt_tokens
        self.num_computed_tokens_np[row] = v.num_computed_tokens
        self.temperature_np[row] = v.temperature
        self.top_p_np[row] = v.top_p
        self.top_k_np[row] = v.top_k
        self.min_p_np[row] = v.min_p
        self.seeds_np[row] = v.seed
        self.presence_penalty_np[row] = v.presence_penalty
        self.frequency_penalty_np[row] = v.frequency_penalty
        self.repetition_penalty_np[row] = v.repetition_penalty
        self.min_tokens_np[row] = v.min_tokens
        self.ignore_eos_np[row] = v.ignore_eos
        self.num_logprobs_np[row] = _NO_LOGPROBS if v.logprobs is None else v.logprobs
        self.num_prompt_logprobs_np[row] = (
            _NO_LOGPROBS if v.prompt_logprobs is None else v.prompt_logprobs
        )
        self.stop_token_ids[row] = tuple(v.stop_token_ids)
        self.logits_processors[row] = tuple(v.logits_processors)

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row (a hole until :meth:`condense`); ``None`` if not present."""
        row = self.req_id_to_row.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.logits_processors[row] = ()  # drop references to caller objects now
        heapq.heappush(self._holes, row)
        return row

    def condense(self) -> list[tuple[int, int]]:
        """Move the last rows into the holes; returns the ``(from_row, to_row)`` moves made
        (the block table must follow them)."""
        moves = []
        last = self._num_rows - 1
        for hole in sorted(self._holes):
            while last >= 0 and self.req_ids[last] is None:
                last -= 1
            if last <= hole:
                break  # every row above the hole is empty
            self._move(last, hole)
            moves.append((last, hole))
            last -= 1
        self._holes = []
        self._num_rows = self.num_reqs
        return moves

    def _move(self, src: int, dst: int) -> None:
        req_id = self.req_ids[src]
        assert req_id is not None
        n = int(self.num_tokens_np[src])
        self.token_ids_np[dst, :n] = self.token_ids_np[src, :n]
        self.token_ids_np[dst, n:] = 0
        for arr in self._row_arrays():
            arr[dst] = arr[src]
        self.stop_token_ids[dst] = self.stop_token_ids[src]
        self.logits_processors[dst] = self.logits_processors[src]
        self.logits_processors[src] = ()
        self.req_ids[dst], self.req_ids[src] = req_id, None
        self.req_id_to_row[req_id] = dst

    def _row_arrays(self) -> list[np.ndarray]:
        return [
            self.num_tokens_np,
            self.num_prompt_tokens_np,
            self.num_computed_tokens_np,
            self.temperature_np,
            self.top_p_np,
            self.top_k_np,
            self.min_p_np,
            self.seeds_np,
            self.presence_penalty_np,
            self.frequency_penalty_np,
            self.repetition_penalty_np,
            self.min_tokens_np,
            self.ignore_eos_np,
            self.num_logprobs_np,
            self.num_prompt_logprobs_np,
        ]

    def append_token_ids(self, row: int, token_ids: Sequence[int]) -> None:
        """Append sampled tokens to the row's history."""
        n = int(self.num_tokens_np[row])
        self.token_ids_np[row, n : n + len(token_ids)] = token_ids
        self.num_tokens_np[row] = n + len(token_ids)

    def output_token_ids(self, row: int) -> np.ndarray:  # [num_output] int32 (a view)
        return self.token_ids_np[row, self.num_prompt_tokens_np[row] : self.num_tokens_np[row]]

    def prompt_token_ids(self, row: int) -> np.ndarray:  # [num_prompt] int32 (a view)
        return self.token_ids_np[row, : self.num_prompt_tokens_np[row]]


__all__ = ["InputBatch", "RequestView"]
