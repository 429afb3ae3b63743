"""The CPU block table of runner_v1: ``[max_num_seqs, max_num_blocks_per_req]`` int32, one row per
batch row, kept in step with :class:`runner_v1.input_batch.InputBatch` (rows move together on
condense). Each step the runner copies rows ``0..num_reqs-1`` whole to the device (the MRV1
cost that runner_v2 avoids)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTable:
    """Physical KV block ids per batch row.

    Args:
        max_num_seqs: rows.
        max_num_blocks_per_req: columns (blocks for ``max_model_len`` tokens).
        block_size: tokens per block.
    """

    def __init__(self, max_num_seqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.block_size = block_size
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_table_np = np.zeros((max_num_seqs, max_num_blocks_per_req), np.int32)
        self.num_blocks_np = np.zeros(max_num_seqs, np.int32)

    def set_row(self, row: int, block_ids: Sequence[int]) -> None:
        """Replace the row's blocks (a new or resumed request); the rest of the row is zeroed."""
        n = len(block_ids)
        self._check(n)
        self.block_table_np[row, :n] = block_ids
        self.block_table_np[row, n:] = 0
        self.num_blocks_np[row] = n

    def append_row(self, row: int, block_ids: Sequence[int]) -> None:
        """Add blocks at the end of the row (a running request grew)."""
        start = int(self.num_blocks_np[row])
        self._check(start + len(block_ids))
        self.block_table_np[row, start : start + len(block_ids)] = block_ids
        self.num_blocks_np[row] = start + len(block_ids)

    def move_row(self, src: int, dst: int) -> None:
        self.block_table_np[dst] = self.block_table_np[src]
        self.num_blocks_np[dst] = self.num_blocks_np[src]

    def slot_mapping(
        self,
        rows: np.ndarray,  # [num_tokens] int, batch row of each token
        positions: np.ndarray,  # [num_tokens] int64
    ) -> np.ndarray:  # [num_tokens] int64, block_id * block_size + offset
        """KV slot of each token."""
        block_ids = self.block_table_np[rows, positions // self.block_size].astype(np.int64)
        slots: np.ndarray = block_ids * self.block_size + positions % self.block_size
        return slots

    def _check(self, num_blocks: int) -> None:
        if num_blocks > self.max_num_blocks_per_req:
            raise ValueError(
                f"{num_blocks} blocks exceed the row width {self.max_num_blocks_per_req}"
            )


__all__ = ["BlockTable"]
