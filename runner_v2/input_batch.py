"""The per-step view of runner_v2: which table rows run, in which order, and their inputs.

``InputBuffers`` are allocated once (``max_num_seqs`` requests, ``max_num_tokens`` tokens) and
every step's inputs are written into them by the Triton kernels of ``kernels/``; an
``InputBatch`` is the small frozen record of one step: ``idx_mapping`` (batch position -> table
row), the host's copy of the scheduled counts, and views of the buffers, sized by the step
(padded for a CUDA-graph batch). Only ``idx_mapping`` and ``num_scheduled_tokens`` cross from
the host for the inputs; token ids, positions, ``seq_lens``, ``query_start_loc``,
``slot_mapping`` and logits indices are built on the device from the request table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.kernels.input_ids import prepare_input_ids
from turnout.kernels.logits_indices import compute_logits_indices
from turnout.kernels.positions import prepare_positions
from turnout.kernels.query_start_loc import prepare_query_start_loc
from turnout.kernels.slot_mapping import compute_slot_mapping


@dataclass(frozen=True)
class InputBuffers:
    """Device buffers the inputs of every step are written into (also the static inputs of
    the captured CUDA graphs)."""

    input_ids: torch.Tensor  # [max_num_tokens] int64
    positions: torch.Tensor  # [max_num_tokens] int64
    slot_mapping: torch.Tensor  # [max_num_tokens] int64
    query_start_loc: torch.Tensor  # [max_num_seqs + 1] int32
    seq_lens: torch.Tensor  # [max_num_seqs] int32
    logits_indices: torch.Tensor  # [max_num_seqs] int64
    block_table: torch.Tensor  # [max_num_seqs, max_num_blocks_per_req] int32, batch order

    @classmethod
    def allocate(
        cls,
        *,
        max_num_seqs: int,
        max_num_tokens: int,
        max_num_blocks_per_req: int,
        device: torch.device,
    ) -> InputBuffers:
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            input_ids=zeros(max_num_tokens, dtype=torch.int64),
            positions=zeros(max_num_tokens, dtype=torch.int64),
            slot_mapping=torch.full((max_num_tokens,), -1, dtype=torch.int64, device=device),
            query_start_loc=zeros(max_num_seqs + 1, dtype=torch.int32),
            seq_lens=zeros(max_num_seqs, dtype=torch.int32),
            logits_indices=zeros(max_num_seqs, dtype=torch.int64),
            block_table=zeros(max_num_seqs, max_num_blocks_per_req, dtype=torch.int32),
        )


@dataclass(frozen=True)
class BatchPlan:
    """The host side of a step, from the scheduler output and the table's host mirrors.

    Attributes:
        req_ids: scheduled requests in batch order.
        idx_mapping_np: ``[num_reqs] int32`` table row of each.
        num_scheduled_np: ``[num_reqs] int32``.
        num_computed_np: ``[num_reqs] int32`` before the step.
        query_start_loc_np: ``[num_reqs + 1] int32``.
        samples_np: ``[num_reqs] bool``, requests whose prefill is complete after the step (a
            partial prefill chunk samples nothing).
        num_reqs_padded, num_tokens_padded: sizes of the forward (a CUDA-graph batch is padded).
    """

    req_ids: list[str]
    idx_mapping_np: np.ndarray
    num_scheduled_np: np.ndarray
    num_computed_np: np.ndarray
    query_start_loc_np: np.ndarray
    samples_np: np.ndarray
    num_reqs_padded: int
    num_tokens_padded: int

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc_np[-1])

    @property
    def seq_lens_np(self) -> np.ndarray:  # [num_reqs] int32, also the sampled token's position
        seq_lens: np.ndarray = self.num_computed_np + self.num_scheduled_np
        return seq_lens

    @property
    def max_query_len(self) -> int:
        return int(self.num_scheduled_np.max()) if self.num_reqs else 0

    @classmethod
    def build(
        cls,
        req_ids: list[str],
        rows: np.ndarray,
        num_scheduled: np.ndarray,
        num_computed_np: np.ndarray,
        num_tokens_np: np.ndarray,
    ) -> BatchPlan:
        """A plan without padding; ``num_computed_np`` / ``num_tokens_np`` are per table row."""
        num_computed = num_computed_np[rows]
        qsl = np.zeros(len(req_ids) + 1, np.int32)
        np.cumsum(num_scheduled, out=qsl[1:])
        samples = num_computed + num_scheduled >= num_tokens_np[rows]
        return cls(
            req_ids,
            rows.astype(np.int32),
            num_scheduled.astype(np.int32),
            num_computed,
            qsl,
            samples,
            len(req_ids),
            int(qsl[-1]),
        )

    def padded(self, size: int, query_len: int = 1) -> BatchPlan:
        """The same step padded to ``size`` requests of ``query_len`` tokens (a CUDA-graph
        batch: decodes, or speculative decodes of ``1 + k`` tokens)."""
        return self.padded_to(size, size * query_len)

    def padded_to(self, num_reqs: int, num_tokens: int) -> BatchPlan:
        """The same step padded to ``num_reqs`` requests and ``num_tokens`` tokens (a mixed
        prefill + decode step replayed from a graph of that token count)."""
        return BatchPlan(
            self.req_ids,
            self.idx_mapping_np,
            self.num_scheduled_np,
            self.num_computed_np,
            self.query_start_loc_np,
            self.samples_np,
            num_reqs,
            num_tokens,
        )


@dataclass(frozen=True)
class InputBatch:
    """One step's inputs on the device (views of :class:`InputBuffers`) and its plan."""

    plan: BatchPlan
    idx_mapping: torch.Tensor  # [num_reqs] int32
    num_scheduled: torch.Tensor  # [num_reqs] int32
    input_ids: torch.Tensor  # [num_tokens_padded] int64
    positions: torch.Tensor  # [num_tokens_padded] int64
    seq_lens: torch.Tensor  # [num_reqs_padded] int32
    logits_indices: torch.Tensor  # [num_reqs] int64
    attn_metadata: AttentionMetadata


def prepare_inputs(
    plan: BatchPlan,
    buffers: InputBuffers,
    *,
    idx_mapping: torch.Tensor,  # [num_reqs] int32 on the device
    num_scheduled: torch.Tensor,  # [num_reqs] int32 on the device
    num_computed: torch.Tensor,  # [max_num_seqs] int32 column of the request table
    prefill_len: torch.Tensor,  # [max_num_seqs] int32 column
    last_sampled: torch.Tensor,  # [max_num_seqs] int32 column
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32
    block_table: torch.Tensor,  # [max_num_seqs, max_num_blocks_per_req] int32, by row
    block_size: int,
    max_model_len: int,
) -> InputBatch:
    """Launch the input kernels of a step into ``buffers`` (no host synchronisation).

    The attention metadata's host ints come from the plan; a padded plan (CUDA graph) uses
    ``max_model_len`` as ``max_seq_len`` so that the captured launch fits every replay.
    """
    n, r_pad, t_pad = plan.num_reqs, plan.num_reqs_padded, plan.num_tokens_padded
    qsl = buffers.query_start_loc[: r_pad + 1]
    positions, seq_lens = buffers.positions[:t_pad], buffers.seq_lens[:r_pad]
    input_ids, slot_mapping = buffers.input_ids[:t_pad], buffers.slot_mapping[:t_pad]
    prepare_query_start_loc(num_scheduled, n, qsl)
    prepare_positions(idx_mapping, num_computed, qsl, n, positions, seq_lens)
    prepare_input_ids(
        idx_mapping, qsl, positions, prefill_len, last_sampled, token_ids, n, input_ids
    )
    compute_slot_mapping(idx_mapping, qsl, positions, block_table, block_size, n, slot_mapping)
    compute_logits_indices(qsl, n, buffers.logits_indices[:n])
    # Attention takes the block table in batch order: gather the scheduled rows.
    torch.index_select(block_table, 0, idx_mapping, out=buffers.block_table[:n])
    padded = r_pad > n
    md = AttentionMetadata(
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_table=buffers.block_table[:r_pad],
        slot_mapping=slot_mapping,
        max_query_len=max(plan.max_query_len, 1 if padded else 0),
        max_seq_len=max_model_len if padded else int(plan.seq_lens_np.max(initial=0)),
        num_actual_tokens=plan.num_tokens,
        block_size=block_size,
    )
    return InputBatch(
        plan,
        idx_mapping,
        num_scheduled,
        input_ids,
        positions,
        seq_lens,
        buffers.logits_indices[:n],
        md,
    )


__all__ = ["BatchPlan", "InputBatch", "InputBuffers", "prepare_inputs"]
