"""RequestStates: runner_v2's request table, resident on the device (docs/architecture.md §5.4).

A fixed table of ``max_num_seqs`` rows. A request owns one row from ``add_request`` to
``remove_request``; rows never move (unlike runner_v1's condensed persistent batch), and a
step's batch order is only an index array (``idx_mapping``: batch position -> row).

Every table lives in one int32 device *arena*, so that all of a step's host-side writes (new
rows, block-table diffs) go in one staged copy and one kernel launch
(``kernels/staged_writes.py``):

- ``row_params [max_num_seqs, NUM_COLS] int32``: per-row counters (``num_computed_tokens``,
  ``num_tokens``, ``prefill_len``, ``num_prompt_tokens``, ``last_sampled``, and the drafts the
  last speculative step verified and accepted) and sampling parameters (float32 fields stored
  by bit pattern, the int64 seed in two words);
- ``token_ids [max_num_seqs, max_model_len] int32``: prompt, then output, per row;
- ``block_table [max_num_seqs, max_num_blocks_per_req] int32``: physical KV blocks per row;
- ``stop_token_ids [max_num_seqs, max_stop_token_ids] int32``: ids ``min_tokens`` masks.

``add_request`` writes every field of its row (counters, parameters, stop ids, tokens, blocks):
nothing survives slot reuse (the speculative counters start at 0 too). Cells past a row's ``num_tokens`` / block count are never read.
``remove_request`` only frees the row. Preemption is remove, then add again with the full token
list (prompt + output so far).

The host keeps numpy mirrors (``*_np``) of what it wrote or can count itself (no device reads):
per-row prompt/prefill lengths, ``num_computed_tokens`` and ``num_tokens`` advanced at each
launched step, the block count (for block-table diffs), and the flags that select the kernels of
a step (penalties, logprobs, prompt logprobs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from turnout.engine.errors import UnsupportedOptionError
from turnout.engine.sampling_params import SamplingParams
from turnout.kernels.gumbel_sample import SamplingTables
from turnout.kernels.staged_writes import apply_staged_writes

_GREEDY_EPS = 1e-5  # docs/sampling.md step 5


class Col(enum.IntEnum):
    """Columns of ``row_params`` (int32 words; F32 fields hold float32 bit patterns)."""

    NUM_COMPUTED_TOKENS = 0
    NUM_TOKENS = 1  # prompt + output tokens in the token table
    PREFILL_LEN = 2  # tokens written by add_request (the prompt, or all tokens on resume)
    NUM_PROMPT_TOKENS = 3
    LAST_SAMPLED = 4
    TEMPERATURE = 5  # F32, 0 for greedy rows
    TOP_K = 6
    TOP_P = 7  # F32
    REPETITION_PENALTY = 8  # F32
    FREQUENCY_PENALTY = 9  # F32
    PRESENCE_PENALTY = 10  # F32
    MIN_TOKENS = 11
    SEED_LO = 12  # with SEED_HI: the int64 seed (8-byte aligned: even column, even width)
    SEED_HI = 13
    NUM_LOGPROBS = 14  # -1: none
    NUM_PROMPT_LOGPROBS = 15  # -1: none
    NUM_DRAFTS = 16  # drafts its last step verified (speculative decoding)
    NUM_ACCEPTED = 17  # drafts its last step accepted
    MIN_P = 18  # F32, 0 disables
    PADDING = 19  # always 0: NUM_COLS stays even, so every row's seed stays 8-byte aligned


NUM_COLS = 20


@dataclass(frozen=True)
class RequestInfo:
    """What the host keeps about a request (also while it is preempted)."""

    req_id: str
    num_prompt_tokens: int
    sampling_params: SamplingParams


class RequestStates:
    """The request table (see the module docstring).

    Args:
        max_num_seqs: rows.
        max_model_len: token-table width.
        max_num_blocks_per_req: block-table width.
        max_stop_token_ids: width of the ``min_tokens`` mask table.
        eos_token_ids: the model's EOS ids (masked under ``min_tokens`` unless ``ignore_eos``).
        device: where the tables live.
    """

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_model_len: int,
        max_num_blocks_per_req: int,
        max_stop_token_ids: int,
        eos_token_ids: tuple[int, ...],
        device: torch.device,
    ) -> None:
        s = max_num_seqs
        self.max_num_seqs, self.max_model_len = s, max_model_len
        self.max_stop_token_ids = max_stop_token_ids
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = device
        widths = (NUM_COLS, max_model_len, max_num_blocks_per_req, max_stop_token_ids)
        self._bases = [s * sum(widths[:i]) for i in range(len(widths))]  # offsets in the arena
        self.arena = torch.zeros(s * sum(widths), dtype=torch.int32, device=device)
        self.row_params, self.token_ids, self.block_table, self.stop_token_ids = (
            self.arena[base : base + s * w].view(s, w)
            for base, w in zip(self._bases, widths, strict=True)
        )
        self._widths = widths
        self.free_rows = list(range(s - 1, -1, -1))  # pop() hands out the lowest row first
        self.req_id_to_row: dict[str, int] = {}
        self.infos: list[RequestInfo | None] = [None] * s
        self.num_prompt_tokens_np = np.zeros(s, np.int32)
        self.prefill_len_np = np.zeros(s, np.int32)
        self.num_computed_np = np.zeros(s, np.int32)
        self.num_tokens_np = np.zeros(s, np.int32)
        self.num_blocks_np = np.zeros(s, np.int32)
        self.num_logprobs_np = np.full(s, -1, np.int32)
        self.num_prompt_logprobs_np = np.full(s, -1, np.int32)
        self.has_penalties_np = np.zeros(s, bool)
        self.is_sampled_np = np.zeros(s, bool)  # temperature > 0 (not greedy)
        self._pending: list[tuple[int, np.ndarray]] = []  # (arena offset, int32 values)
        self._make_views()

    # ---- column views ------------------------------------------------------------------
    # Made once: the arena never moves, and a view costs the host microseconds per step.
    def col(self, c: Col) -> torch.Tensor:  # [max_num_seqs] int32, stride NUM_COLS
        return self._cols[c]

    def col_f32(self, c: Col) -> torch.Tensor:  # [max_num_seqs] float32, stride NUM_COLS
        return self._cols_f32[c]

    @property
    def seed(self) -> torch.Tensor:  # [max_num_seqs] int64
        return self._seed

    def sampling_tables(self) -> SamplingTables:
        """Views of the per-row sampling parameters for the sampler kernels (one object)."""
        return self._tables

    def _make_views(self) -> None:
        self._cols = [self.row_params[:, c] for c in Col]
        self._cols_f32 = [col.view(torch.float32) for col in self._cols]
        self._seed = self.row_params[:, Col.SEED_LO : Col.SEED_HI + 1].view(torch.int64)[:, 0]
        self._tables = SamplingTables(
            temperature=self.col_f32(Col.TEMPERATURE),
            top_k=self.col(Col.TOP_K),
            top_p=self.col_f32(Col.TOP_P),
            min_p=self.col_f32(Col.MIN_P),
            repetition_penalty=self.col_f32(Col.REPETITION_PENALTY),
            frequency_penalty=self.col_f32(Col.FREQUENCY_PENALTY),
            presence_penalty=self.col_f32(Col.PRESENCE_PENALTY),
            min_tokens=self.col(Col.MIN_TOKENS),
            num_prompt_tokens=self.col(Col.NUM_PROMPT_TOKENS),
            seed=self.seed,
            stop_token_ids=self.stop_token_ids,
        )

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_row)

    # ---- lifecycle ---------------------------------------------------------------------
    def check_sampling_params(self, params: SamplingParams) -> None:
        """Refuse what the table cannot hold.

        Raises:
            UnsupportedOptionError: ``min_tokens`` with more stop ids (EOS included) than
                ``max_stop_token_ids``.
        """
        if params.min_tokens > 0 and len(self._masked_ids(params)) > self.max_stop_token_ids:
            raise UnsupportedOptionError(
                f"min_tokens with {len(self._masked_ids(params))} stop token ids (EOS included): "
                f"runner_v2 masks at most {self.max_stop_token_ids}"
            )

    def add_request(
        self,
        req_id: str,
        *,
        token_ids: list[int],
        num_prompt_tokens: int,
        num_computed_tokens: int,
        block_ids: list[int],
        params: SamplingParams,
    ) -> int:
        """Bind a request (new, or resumed with its full token list) to a free row and stage
        the writes of every field of that row. Returns the row.

        Raises:
            RuntimeError: no free row, or the id is already bound (a scheduler bug).
        """
        if req_id in self.req_id_to_row or not self.free_rows:
            raise RuntimeError(
                f"cannot bind {req_id!r}: bound already or no free row of {self.max_num_seqs}"
            )
        row = self.free_rows.pop()
        self.req_id_to_row[req_id] = row
        self.infos[row] = RequestInfo(req_id, num_prompt_tokens, params)
        n = len(token_ids)
        self._stage(0, row, 0, self._row_words(params, n, num_prompt_tokens, num_computed_tokens))
        self._stage(1, row, 0, np.asarray(token_ids, np.int32))
        self._stage(2, row, 0, np.asarray(block_ids, np.int32))
        stop = np.full(self.max_stop_token_ids, -1, np.int32)
        masked = self._masked_ids(params) if params.min_tokens > 0 else []
        stop[: len(masked)] = masked
        self._stage(3, row, 0, stop)
        self.num_prompt_tokens_np[row] = num_prompt_tokens
        self.prefill_len_np[row] = self.num_tokens_np[row] = n
        self.num_computed_np[row] = num_computed_tokens
        self.num_blocks_np[row] = len(block_ids)
        self.num_logprobs_np[row] = -1 if params.logprobs is None else params.logprobs
        self.num_prompt_logprobs_np[row] = (
            -1 if params.prompt_logprobs is None else params.prompt_logprobs
        )
        self.has_penalties_np[row] = params.has_penalties
        self.is_sampled_np[row] = params.temperature >= _GREEDY_EPS
        return row

    def append_block_ids(self, req_id: str, block_ids: list[int]) -> None:
        """Stage a block-table diff: ``block_ids`` appended to the request's row."""
        row = self.req_id_to_row[req_id]
        start = int(self.num_blocks_np[row])
        self._stage(2, row, start, np.asarray(block_ids, np.int32))
        self.num_blocks_np[row] = start + len(block_ids)

    def remove_request(self, req_id: str) -> RequestInfo | None:
        """Free the request's row (nothing is cleared: the next ``add_request`` writes every
        field). Returns what the host kept about it, or ``None`` if it holds no row."""
        row = self.req_id_to_row.pop(req_id, None)
        if row is None:
            return None
        info = self.infos[row]
        self.infos[row] = None
        self.free_rows.append(row)
        self._drop_staged(row)
        return info

    def take_staged_writes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The writes staged since the last call, packed for one transfer: ``(dst_offsets
        [n] int64, cu_num_values [n + 1] int32, values [total] int32)``, or ``None``."""
        if not self._pending:
            return None
        offsets = np.asarray([o for o, _ in self._pending], np.int64)
        lens = np.asarray([len(v) for _, v in self._pending], np.int64)
        values = np.concatenate([v for _, v in self._pending])
        self._pending = []
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        return offsets, cu, values

    def apply_staged_writes(
        self, dst_offsets: torch.Tensor, cu_num_values: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Apply writes from :meth:`take_staged_writes`, now on the device, in one launch
        (before any kernel of the step reads the table)."""
        apply_staged_writes(self.arena, dst_offsets, cu_num_values, values)

    # ---- internals ---------------------------------------------------------------------
    def _drop_staged(self, row: int) -> None:
        # Writes staged for a row that is freed before they were taken (a step that failed
        # part-way) must not reach the table with its next owner's: the writes of one launch
        # may not overlap (kernels/staged_writes.py), so which one landed would be a race.
        spans = [
            (base + row * w, base + (row + 1) * w)
            for base, w in zip(self._bases, self._widths, strict=True)
        ]
        self._pending = [(o, v) for o, v in self._pending if not any(a <= o < b for a, b in spans)]

    def _stage(self, table: int, row: int, col: int, values: np.ndarray) -> None:
        if len(values):
            self._pending.append((self._bases[table] + row * self._widths[table] + col, values))

    def _masked_ids(self, params: SamplingParams) -> list[int]:
        eos = [] if params.ignore_eos else sorted(self.eos_token_ids)
        return list(dict.fromkeys([*eos, *params.stop_token_ids]))

    @staticmethod
    def _row_words(
        params: SamplingParams, num_tokens: int, num_prompt: int, num_computed: int
    ) -> np.ndarray:
        words = np.zeros(NUM_COLS, np.int32)
        f32 = words.view(np.float32)
        words[Col.NUM_COMPUTED_TOKENS] = num_computed
        words[Col.NUM_TOKENS] = words[Col.PREFILL_LEN] = num_tokens
        words[Col.NUM_PROMPT_TOKENS] = num_prompt
        words[Col.LAST_SAMPLED] = -1
        f32[Col.TEMPERATURE] = 0.0 if params.temperature < _GREEDY_EPS else params.temperature
        words[Col.TOP_K] = params.top_k
        f32[Col.TOP_P] = params.top_p
        f32[Col.MIN_P] = params.min_p
        f32[Col.REPETITION_PENALTY] = params.repetition_penalty
        f32[Col.FREQUENCY_PENALTY] = params.frequency_penalty
        f32[Col.PRESENCE_PENALTY] = params.presence_penalty
        words[Col.MIN_TOKENS] = params.min_tokens
        words[Col.SEED_LO : Col.SEED_HI + 1] = np.asarray([params.seed or 0], np.int64).view(
            np.int32
        )
        words[Col.NUM_LOGPROBS] = -1 if params.logprobs is None else params.logprobs
        words[Col.NUM_PROMPT_LOGPROBS] = (
            -1 if params.prompt_logprobs is None else params.prompt_logprobs
        )
        words[Col.NUM_DRAFTS] = words[Col.NUM_ACCEPTED] = words[Col.PADDING] = 0
        return words


__all__ = ["NUM_COLS", "Col", "RequestInfo", "RequestStates"]
