"""runner_v1's decode CUDA graphs, as vLLM's MRV1 has them (vllm/v1/worker/gpu_model_runner.py
``capture_model``): the forward pass of a pure-decode step replayed from a graph captured per
padded batch size, everything else of the old design kept.

The step's inputs are still built with numpy on the host and copied to the device each step,
the block table whole (``runner_v1/inputs.py``); on a graph step they are then copied into the
static buffers the graphs were captured over, padded to the capture size (padding tokens write
no KV slot, padding requests have empty queries), and the graph is replayed. Sampling, the
host sync for the sampled ids and the next step's preparation stay as they were: what a V2/V1
ratio then measures is the designs (GPU-resident inputs, async scheduling), not graphs.
"""

from __future__ import annotations

from typing import Any

import torch

from turnout.engine.cuda_graphs import DecodeGraphs, capture_sizes, graph_forward, set_dummy_inputs
from turnout.engine.model.attention_metadata import AttentionMetadata


class V1DecodeGraphs:
    """Static input buffers and the captured graphs of runner_v1's decode steps.

    Args:
        max_num_seqs: the largest batch (and capture size).
        max_num_blocks_per_req: columns of the block table.
        max_model_len: ``max_seq_len`` of the captured launches (fits every replay).
        block_size: tokens per KV block.
        device: a CUDA device.
    """

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_num_blocks_per_req: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_num_seqs, dtype=torch.int64)
        self.positions = zeros(max_num_seqs, dtype=torch.int64)
        self.slot_mapping = torch.full((max_num_seqs,), -1, dtype=torch.int64, device=device)
        self.query_start_loc = zeros(max_num_seqs + 1, dtype=torch.int32)
        self.seq_lens = zeros(max_num_seqs, dtype=torch.int32)
        self.block_table = zeros(max_num_seqs, max_num_blocks_per_req, dtype=torch.int32)
        self.max_model_len, self.block_size = max_model_len, block_size
        self.graphs = DecodeGraphs(capture_sizes(max_num_seqs))

    def capture(self, model: torch.nn.Module, kv_caches: list[Any]) -> None:
        """Capture every size over the buffers (``engine.cuda_graphs.graph_forward``)."""
        self.graphs.capture(
            lambda size: set_dummy_inputs(self, size, 1),
            lambda size: graph_forward(
                model,
                self,
                kv_caches,
                size,
                1,
                max_model_len=self.max_model_len,
                block_size=self.block_size,
            ),
        )

    def padded_size(self, num_reqs: int) -> int | None:
        """The capture size a decode step of ``num_reqs`` requests replays at (None: eager)."""
        return self.graphs.padded_size(num_reqs)

    def replay(
        self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata, size: int
    ) -> torch.Tensor:  # [num_reqs, hidden_size]
        """Copy a decode step's device inputs (one token per request) into the buffers, padded
        to ``size``, and replay; the real rows' hidden states (a view of the graph's output)."""
        n = md.num_reqs
        self.input_ids[:n].copy_(input_ids)
        self.input_ids[n:size].zero_()
        self.positions[:n].copy_(positions)
        self.positions[n:size].zero_()
        self.slot_mapping[:n].copy_(md.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.query_start_loc[: n + 1].copy_(md.query_start_loc)
        self.query_start_loc[n + 1 : size + 1].fill_(n)  # padding requests: empty queries
        self.seq_lens[:n].copy_(md.seq_lens)
        self.seq_lens[n:size].zero_()
        self.block_table[:n].copy_(md.block_table)
        return self.graphs.replay(size)[:n]

    @property
    def num_captured(self) -> int:
        return self.graphs.num_captured


__all__ = ["V1DecodeGraphs"]
