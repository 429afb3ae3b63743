"""runner_v2's CUDA graphs (``engine/cuda_graphs.py``): which graph a step replays, and the
capture of all of them at start-up.

- decode steps (one token per request) by padded request count;
- speculative decodes (``1 + k`` tokens per request) by padded request count;
- mixed prefill + decode steps by padded token count, with ``max_num_seqs`` requests (none
  with speculation: a draft model mirrors prefill chunks eagerly; none for models with
  recurrent state or whose attention grid follows the step's query lengths, see
  ``DecoderModel.MIXED_STEP_GRAPHS``);
- a draft model's own 1- and 2-token forwards (``runner_v2/draft_model.py``).

A step that needs every hidden row (prompt logprobs), or is larger than every captured size,
runs eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from turnout.engine.config import EngineConfig
from turnout.engine.cuda_graphs import (
    DecodeGraphs,
    MixedGraphs,
    capture_sizes,
    graph_forward,
    mixed_capture_sizes,
    mixed_graph_forward,
    set_dummy_inputs,
    set_dummy_mixed_inputs,
)
from turnout.runner_v2.input_batch import BatchPlan


class RunnerGraphs:
    """The graphs of one runner_v2 instance (empty sets where graphs are off).

    Args:
        config: the engine configuration (``max_num_seqs``, ``max_num_batched_tokens``,
            ``num_speculative_tokens``).
        enabled: graphs at all (CUDA and not ``enforce_eager``).
        speculative: a speculative method is configured.
    """

    def __init__(self, config: EngineConfig, enabled: bool, speculative: bool) -> None:
        self.config = config
        self.decode = DecodeGraphs(capture_sizes(config.max_num_seqs) if enabled else [])
        q = config.num_speculative_tokens + 1  # a speculative decode: its last token and k drafts
        spec_sizes = capture_sizes(min(config.max_num_seqs, config.max_num_batched_tokens // q))
        self.spec = DecodeGraphs(spec_sizes if enabled and speculative else [], query_len=q)
        # A step holds at most max_num_seqs requests of max_model_len tokens: larger captures
        # would never replay, and their dummy requests would outgrow a block-table row.
        top = min(config.max_num_batched_tokens, config.max_num_seqs * config.max_model_len)
        mixed = mixed_capture_sizes(top) if enabled and not speculative else []
        self.mixed = MixedGraphs(mixed, config.max_num_seqs)

    def restrict_to(self, model: Any, has_inner_state: bool) -> None:
        """Drop the graphs ``model`` cannot replay: models with Mamba layers run eagerly (a
        padded graph batch would have to point its padding rows at no state slot), and mixed
        steps need ``MIXED_STEP_GRAPHS``."""
        if has_inner_state:
            self.decode = DecodeGraphs([])
        if has_inner_state or not getattr(model, "MIXED_STEP_GRAPHS", False):
            self.mixed = MixedGraphs([], self.config.max_num_seqs)

    def capture(self, model: Any, buffers: Any, kv_caches: list[Any], draft: Any | None) -> None:
        """Capture every graph (start-up only): the target's decode, speculative and mixed
        graphs, and the draft's 1- and 2-token graphs over its own buffers."""
        todo = [(g, model, buffers, kv_caches) for g in (self.decode, self.spec) if g.sizes]
        if draft is not None:
            for q in (1, 2):
                draft.graphs[q] = DecodeGraphs(capture_sizes(self.config.max_num_seqs), query_len=q)
                todo.append((draft.graphs[q], draft.model, draft, draft.kv_caches))
        lengths = {"max_model_len": self.config.max_model_len, "block_size": self.config.block_size}
        with torch.inference_mode():
            for graphs, m, b, caches in todo:
                q = graphs.query_len

                def set_inputs(size: int, b: Any = b, q: int = q) -> None:
                    set_dummy_inputs(b, size, q)

                def forward(
                    size: int, m: Any = m, b: Any = b, c: list[Any] = caches, q: int = q
                ) -> torch.Tensor:
                    return graph_forward(m, b, c, size, q, **lengths)

                graphs.capture(set_inputs, forward)
            r = self.mixed.num_reqs
            if self.mixed.sizes:
                self.mixed.capture(
                    lambda t: set_dummy_mixed_inputs(buffers, r, t),
                    lambda t: mixed_graph_forward(model, buffers, kv_caches, r, t, **lengths),
                )

    def choose(
        self, plan: BatchPlan, needs_all_hidden: bool, spec_uniform: bool | None
    ) -> tuple[DecodeGraphs, int] | None:
        """The graph a step replays and its size, or None (eager).

        Args:
            plan: the step's unpadded plan.
            needs_all_hidden: prompt logprobs read every hidden row.
            spec_uniform: None without drafts this step; else whether every request verifies
                the same number of drafts.
        """
        if needs_all_hidden:
            return None
        if spec_uniform is not None:
            graphs: DecodeGraphs = self.spec
            size = graphs.padded_size(plan.num_reqs) if spec_uniform else None
        elif plan.max_query_len == 1:
            graphs = self.decode
            size = graphs.padded_size(plan.num_reqs)
        else:
            graphs = self.mixed
            size = graphs.padded_size(plan.num_tokens)
        return None if size is None else (graphs, size)

    @staticmethod
    def pad(plan: BatchPlan, graph: tuple[DecodeGraphs, int]) -> BatchPlan:
        """``plan`` padded to the shape ``graph`` was captured at."""
        graphs, size = graph
        if isinstance(graphs, MixedGraphs):
            return plan.padded_to(graphs.num_reqs, size)
        return plan.padded(size, plan.max_query_len)


__all__ = ["RunnerGraphs"]
