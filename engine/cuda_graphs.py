"""CUDA graphs of decode steps, captured per padded batch size (both runners' decode graphs).

A step whose queries are all one token long runs as a replay of the graph captured for the
next capture size at or above its request count, with the batch padded to that size: padding
requests get empty queries (``query_start_loc`` repeats the total, ``seq_lens`` 0) and padding
tokens ``slot_mapping == -1``, so they neither read nor write the KV cache. The graph's static
output is the hidden states ``[size, hidden_size]``; the LM head runs after the replay on the
real rows only. Sizes follow vLLM's default capture list (1, 2, 4, then every multiple of 8 up
to ``max_num_seqs``; vllm/config/compilation.py ``cudagraph_capture_sizes``); graphs share one
memory pool, largest first.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, 16, ... up to (and including) ``max_num_seqs``."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sorted({*sizes, max_num_seqs})


class DecodeGraphs:
    """Captured decode graphs by padded batch size.

    Args:
        sizes: batch sizes to capture (ascending); empty: every step runs eagerly.
    """

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sorted(sizes)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._hidden: dict[int, torch.Tensor] = {}

    def padded_size(self, num_reqs: int) -> int | None:
        """The captured size a decode batch of ``num_reqs`` runs at, or ``None`` (eager)."""
        i = bisect.bisect_left(self.sizes, num_reqs)
        if i == len(self.sizes) or self.sizes[i] not in self._graphs:
            return None
        return self.sizes[i]

    def capture(
        self,
        set_dummy_inputs: Callable[[int], None],  # fills the input buffers for a size
        forward: Callable[[int], torch.Tensor],  # forward over the buffers -> hidden states
    ) -> None:
        """Capture every size, largest first (the shared pool then fits the smaller ones).

        Runs once, at start-up (``initialize_kv_cache``), never on the step path.
        """
        pool = None
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            set_dummy_inputs(size)
            # Warm up outside the graph (Triton compiles, the allocator settles), on a side
            # stream as torch.cuda.graphs requires.
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                forward(size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._hidden[size] = forward(size)
            pool = graph.pool()
            self._graphs[size] = graph

    def replay(self, size: int) -> torch.Tensor:  # [size, hidden_size], static
        """Replay the graph of ``size`` (inputs already in the buffers); its hidden states."""
        self._graphs[size].replay()
        return self._hidden[size]

    @property
    def num_captured(self) -> int:
        return len(self._graphs)


__all__ = ["DecodeGraphs", "capture_sizes"]
