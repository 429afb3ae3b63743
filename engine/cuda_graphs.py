"""CUDA graphs of decode steps, captured per padded batch size; both runners replay them
(runner_v2 for every decode shape, runner_v1 for one-token decodes, as vLLM's MRV1).

A step whose queries are all one token long (decodes; the last token of a chunked prompt too),
or all ``1 + k`` tokens long (speculative decodes verifying ``k`` drafts; a draft model's own
forwards of 1 and 2 tokens), runs as a replay of a graph captured for the next capture size at
or above its request count, with the request count and the token count padded to that size
(``query_len`` tokens per request): padding requests get empty
queries (``query_start_loc`` repeats the total, ``seq_lens`` 0) and padding tokens get
``slot_mapping == -1``, so they neither read nor write the KV cache. One kernel-launch sequence
of ~10 kernels per layer becomes a single replay; the inputs are the runner's persistent input
buffers, filled before the replay (vLLM's full decode CUDA graphs). The LM head runs after the
replay on the real rows only: a graph's static output is its hidden states
(``[size, hidden_size]``), not ``[size, vocab_size]`` logits per captured size.

Sizes follow vLLM's default capture list (vllm/config/compilation.py
``cudagraph_capture_sizes``): 1, 2, 4, then every multiple of 8 up to ``max_num_seqs``.
Graphs share one memory pool, largest first.

Mixed steps (prefill chunks beside decodes, runner_v2) replay :class:`MixedGraphs`, captured per
padded *token* count (``mixed_capture_sizes``) with the request count always padded to
``max_num_seqs``: attention's grid is sized by ``num_tokens // BLOCK_Q + num_reqs`` and finds
each program's request on the device (``kernels/paged_attention.py``), so one captured launch
serves any split of the tokens among the requests. This is vLLM's FULL cudagraph mode for
mixed batches (vllm/config/compilation.py ``CUDAGraphMode.FULL``), with token buckets instead
of torch.compile's piecewise graphs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import torch

from turnout.engine.model.attention_metadata import AttentionMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every multiple of 8, up to (and including) ``max_num_seqs``
    (none for ``max_num_seqs < 1``)."""
    if max_num_seqs < 1:
        return []
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sorted({*sizes, max_num_seqs})


#: Token counts of mixed-step graphs, below ``max_num_batched_tokens`` (which is always one).
MIXED_TOKEN_SIZES: tuple[int, ...] = (
    64,
    128,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
    12288,
    16384,
)
#: Larger mixed steps run eagerly: a graph holds its activations in the pool for good.
MAX_MIXED_GRAPH_TOKENS = 16384


def mixed_capture_sizes(max_num_batched_tokens: int) -> list[int]:
    """Token counts to capture mixed steps at: :data:`MIXED_TOKEN_SIZES` below the step budget,
    and the budget itself (capped at :data:`MAX_MIXED_GRAPH_TOKENS`)."""
    top = min(max_num_batched_tokens, MAX_MIXED_GRAPH_TOKENS)
    if top < 1:
        return []
    return sorted({*(s for s in MIXED_TOKEN_SIZES if s < top), top})


class DecodeGraphs:
    """Captured decode graphs by padded batch size.

    Args:
        sizes: batch sizes to capture (ascending).
        query_len: tokens per request of the captured batches.
    """

    def __init__(self, sizes: list[int], query_len: int = 1) -> None:
        self.sizes = sorted(sizes)
        self.query_len = query_len
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
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch.cuda.Stream.__new__ is unannotated
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

    def replay(self, size: int) -> torch.Tensor:  # [size * query_len, hidden_size], static
        """Replay the graph of ``size`` (inputs already in the buffers); its hidden states."""
        self._graphs[size].replay()
        return self._hidden[size]

    @property
    def num_captured(self) -> int:
        return len(self._graphs)


class MixedGraphs(DecodeGraphs):
    """Captured mixed-step graphs by padded token count; each holds ``num_reqs`` requests (the
    runner's ``max_num_seqs``). ``padded_size`` and ``replay`` take and give token counts."""

    def __init__(self, token_sizes: list[int], num_reqs: int) -> None:
        super().__init__(token_sizes, query_len=0)
        self.num_reqs = num_reqs


def set_dummy_mixed_inputs(buffers: Any, num_reqs: int, num_tokens: int) -> None:
    """Fill the input buffers for a mixed-step capture: ``num_tokens`` tokens spread over
    ``num_reqs`` requests (at most ``cdiv(num_tokens, num_reqs)`` each, so no request outgrows a
    block-table row), every slot ``-1``."""
    dev = buffers.query_start_loc.device
    buffers.input_ids[:num_tokens].zero_()
    buffers.positions[:num_tokens].zero_()
    buffers.slot_mapping[:num_tokens].fill_(-1)
    per_req = torch.full((num_reqs,), num_tokens // num_reqs, dtype=torch.int32, device=dev)
    per_req[: num_tokens % num_reqs] += 1
    buffers.query_start_loc[0] = 0
    torch.cumsum(per_req, 0, out=buffers.query_start_loc[1 : num_reqs + 1])
    buffers.seq_lens[:num_reqs].copy_(per_req)
    buffers.block_table[:num_reqs].zero_()


def set_dummy_inputs(buffers: Any, size: int, query_len: int) -> None:
    """Fill a runner's input buffers (fields ``input_ids``,
    ``positions``, ``slot_mapping``, ``query_start_loc``, ``seq_lens``, ``block_table``) for a
    capture of ``size`` requests of ``query_len`` tokens: the capture writes no KV slot."""
    t = size * query_len
    buffers.input_ids[:t].zero_()
    buffers.positions[:t].zero_()
    buffers.slot_mapping[:t].fill_(-1)
    qsl = (
        torch.arange(size + 1, dtype=torch.int32, device=buffers.query_start_loc.device) * query_len
    )
    buffers.query_start_loc[: size + 1].copy_(qsl)
    buffers.seq_lens[:size].fill_(query_len)
    buffers.block_table[:size].zero_()


def graph_forward(
    model: Any,
    buffers: Any,
    kv_caches: list[Any],
    size: int,
    query_len: int,
    *,
    max_model_len: int,
    block_size: int,
) -> torch.Tensor:  # [size * query_len, hidden]
    """The forward a graph captures: ``model`` over the buffers of ``size`` requests of
    ``query_len`` tokens (``max_seq_len = max_model_len``, so that every replay fits)."""
    return buffers_forward(
        model,
        buffers,
        kv_caches,
        size,
        size * query_len,
        query_len,
        max_model_len=max_model_len,
        block_size=block_size,
    )


def mixed_graph_forward(
    model: Any,
    buffers: Any,
    kv_caches: list[Any],
    num_reqs: int,
    num_tokens: int,
    *,
    max_model_len: int,
    block_size: int,
) -> torch.Tensor:  # [num_tokens, hidden]
    """The forward a mixed-step graph captures: ``num_tokens`` tokens of up to ``num_reqs``
    requests, attention launched for queries of up to ``min(num_tokens, max_model_len)``."""
    return buffers_forward(
        model,
        buffers,
        kv_caches,
        num_reqs,
        num_tokens,
        min(num_tokens, max_model_len),
        max_model_len=max_model_len,
        block_size=block_size,
    )


def buffers_forward(
    model: Any,
    buffers: Any,
    kv_caches: list[Any],
    num_reqs: int,
    num_tokens: int,
    max_query_len: int,
    *,
    max_model_len: int,
    block_size: int,
) -> torch.Tensor:
    """``model`` over the first ``num_reqs`` requests and ``num_tokens`` tokens of the buffers,
    with ``max_seq_len = max_model_len`` so that every replay fits the captured launches."""
    md = AttentionMetadata(
        query_start_loc=buffers.query_start_loc[: num_reqs + 1],
        seq_lens=buffers.seq_lens[:num_reqs],
        block_table=buffers.block_table[:num_reqs],
        slot_mapping=buffers.slot_mapping[:num_tokens],
        max_query_len=max_query_len,
        max_seq_len=max_model_len,
        num_actual_tokens=num_tokens,
        block_size=block_size,
    )
    hidden: torch.Tensor = model(
        buffers.input_ids[:num_tokens], buffers.positions[:num_tokens], kv_caches, md
    )
    return hidden


__all__ = [
    "DecodeGraphs",
    "MixedGraphs",
    "buffers_forward",
    "capture_sizes",
    "graph_forward",
    "mixed_capture_sizes",
    "mixed_graph_forward",
    "set_dummy_inputs",
    "set_dummy_mixed_inputs",
]
