"""A draft model for speculative decoding on runner_v2 (``speculative_config`` method
``draft_model``): a smaller decoder of the target's vocabulary proposes ``k`` tokens per
decoding request, on the device, at the start of each step.

**Its KV cache** has its own tensors but the target's block ids, block tables and slot layout:
every KV block the scheduler hands out holds the target's and the draft's keys and values of the
same positions (the block's bytes are both models', ``block_bytes``), so prefix-cache hits,
preemption and the free list need nothing of their own. Invariant after every step: the draft's
KV is valid for every position below ``num_computed_tokens - 1`` of each request.

- A prefilling request (a prompt chunk, a resume): the draft runs the same forward as the
  target over the same inputs (``mirror``), after the target.
- A decoding request (``num_computed_tokens = C``, its last sampled token ``x`` at position
  ``C``): one forward of 2 tokens per request, the token at ``C - 1`` and ``x`` (``C - 1`` is
  the one position the invariant does not cover: a step that accepted all its drafts never fed
  the last one to the draft), whose logits propose ``d_1`` at ``C + 1``; then ``k - 1`` forwards
  of 1 token, ``d_j`` at ``C + j``, proposing ``d_{j+1}``. Each draft is drawn with the request's
  own sampling parameters (greedy: argmax; else the Gumbel-max draw from the processed
  distribution ``q``, whose probabilities the rejection rule needs) and written into the token
  table at its position, where the target's inputs and penalty counts read it.

A request with fewer drafts scheduled than the batch's most (near ``max_tokens``, or the budget)
stops there: its later forwards re-read its last scheduled position and write nothing
(``slot_mapping = -1``: no block is reserved past it, and none is read), and the drafts they
draw are not stored. Every forward has ``q`` tokens per request (1 or 2), so each replays a CUDA graph when
one is captured (``graphs``, captured by the runner over this object's input buffers, which
have ``InputBuffers``' field names). Imports no sibling module: it calls the kernels itself and
is given its graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineConfigError
from turnout.engine.model import AttentionMetadata, DecoderModel, allocate_kv_caches, load_model
from turnout.kernels.gumbel_sample import SamplingTables, gumbel_sample
from turnout.kernels.input_ids import prepare_input_ids
from turnout.kernels.logits_indices import compute_logits_indices
from turnout.kernels.penalties import build_penalty_counts
from turnout.kernels.positions import prepare_positions
from turnout.kernels.query_start_loc import prepare_query_start_loc
from turnout.kernels.sampling_probs import compute_probs
from turnout.kernels.slot_mapping import compute_slot_mapping


def load_draft_model(
    config: EngineConfig, target: DecoderModel, dtype: torch.dtype, device: torch.device
) -> DecoderModel:
    """The draft of ``config.speculative_config`` (the target itself when it names the same
    model: the weights are shared, the KV cache is not).

    Raises:
        EngineConfigError: the draft's vocabulary is not the target's, it has Mamba layers or
            pools, or it cannot reach ``max_model_len`` positions.
        FileNotFoundError, ModelConfigError, WeightLoadError: the draft cannot be read.
    """
    spec = config.speculative_config
    assert spec is not None and spec.model is not None
    path = Path(spec.model)
    if not path.exists():
        raise FileNotFoundError(
            f"draft model {spec.model} (speculative_config['model']) does not exist"
        )
    if path.resolve() == Path(config.model).resolve():
        return target
    draft = load_model(
        path, dtype=dtype, device=device, seed=config.seed, load_format=config.load_format
    )
    cfg = draft.config
    if not isinstance(draft, DecoderModel) or cfg.is_pooling or cfg.has_inner_state:
        raise EngineConfigError(
            f"draft model {spec.model} ({cfg.architecture}) must be a decoder without "
            "Mamba layers: its KV cache shares the target's blocks"
        )
    if cfg.vocab_size != target.config.vocab_size:
        raise EngineConfigError(
            f"draft model {spec.model} has vocab_size {cfg.vocab_size}, the target "
            f"{target.config.vocab_size}: speculative decoding with a draft model needs the same vocabulary"
        )
    if cfg.max_position_embeddings < config.max_model_len:
        raise EngineConfigError(
            f"draft model {spec.model} reaches {cfg.max_position_embeddings} positions, fewer than "
            f"max_model_len={config.max_model_len}"
        )
    return draft


@dataclass(frozen=True)
class DraftStep:
    """The decoding requests of a step, for the draft (device tensors unless noted).

    Attributes:
        rows_np: ``[m]`` their table rows (host).
        rows: ``[m] int32`` the same on the device.
        num_spec: ``[m] int32`` drafts scheduled per request (``<= k``).
        max_spec: the largest of them (host int): drafts to propose.
        num_computed: ``[max_num_seqs] int32`` column (``C`` per row, before the step).
        num_computed_np: ``[max_num_seqs]`` host upper bound of it.
        token_ids, block_table: the request table's.
        tables: its sampling parameters.
        use_penalties, want_probs: a request has a penalty / samples (host flags).
    """

    rows_np: np.ndarray
    rows: torch.Tensor
    num_spec: torch.Tensor
    max_spec: int
    num_computed: torch.Tensor
    num_computed_np: np.ndarray
    token_ids: torch.Tensor
    block_table: torch.Tensor
    tables: SamplingTables
    use_penalties: bool
    want_probs: bool

    @property
    def num_reqs(self) -> int:
        return int(self.rows_np.shape[0])


class DraftModelProposer:
    """Proposes drafts with a draft model (see the module docstring).

    Args:
        config: the engine's configuration (``speculative_config.num_speculative_tokens`` = k).
        model: the draft (``load_draft_model``).
    """

    def __init__(self, config: EngineConfig, model: DecoderModel, device: torch.device) -> None:
        assert config.speculative_config is not None
        self.config, self.model, self.device = config, model, device
        self.k = config.speculative_config.num_speculative_tokens
        self.kv_caches: list[Any] = []
        self.graphs: dict[int, Any] = {}  # query length -> engine.cuda_graphs.DecodeGraphs
        self.num_graph_forwards = self.num_eager_forwards = 0
        s, width = config.max_num_seqs, config.max_num_blocks_per_req

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids, self.positions = (
            zeros(2 * s, dtype=torch.int64),
            zeros(2 * s, dtype=torch.int64),
        )
        self.slot_mapping = torch.full((2 * s,), -1, dtype=torch.int64, device=device)
        self.query_start_loc, self.seq_lens = (
            zeros(s + 1, dtype=torch.int32),
            zeros(s, dtype=torch.int32),
        )
        self.logits_indices = zeros(s, dtype=torch.int64)
        self.block_table = zeros(s, width, dtype=torch.int32)
        self._query_lens = {
            q: torch.full((s,), q, dtype=torch.int32, device=device) for q in (1, 2)
        }
        self._arange = torch.arange(s, dtype=torch.int32, device=device)
        # Every draft input comes from the token table (prepare_input_ids reads the table below
        # this "prefill length"): a stride-0 column of max_model_len.
        self._from_table = torch.full(
            (1,), config.max_model_len, dtype=torch.int32, device=device
        ).expand(s)

    # ---- set-up ------------------------------------------------------------------------
    def block_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the draft's KV in one block (added to the target's)."""
        return int(self.model.kv_cache_spec.bytes_per_block(self.config.block_size, dtype))

    def allocate(self, num_blocks: int, dtype: torch.dtype) -> None:
        """The draft's KV caches, ``num_blocks`` blocks: the target's block ids."""
        self.kv_caches = list(
            allocate_kv_caches(
                self.model.kv_cache_spec, num_blocks, self.config.block_size, dtype, self.device
            )
        )

    # ---- the step ----------------------------------------------------------------------
    def mirror(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> None:
        """The target's forward of this step, on the draft (prefill chunks; KV only)."""
        self.model(input_ids, positions, self.kv_caches, attn_metadata)

    def propose(self, step: DraftStep) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Feed each decoding request's last two tokens (KV upkeep), then propose up to
        ``step.max_spec`` drafts. Returns ``(drafts [m, k] int32, q [m, k, vocab] float32 or
        None)`` (``None`` when no draft is scheduled)."""
        base = step.num_computed.index_select(0, step.rows)  # C: position of the last sampled token
        logits = self._forward(step, 2, base - 1, None)
        if step.max_spec == 0:
            return None
        m, vocab, width = step.num_reqs, logits.shape[1], self.config.max_model_len
        drafts = torch.full((m, self.k), -1, dtype=torch.int32, device=self.device)
        probs = (
            torch.empty(m, self.k, vocab, dtype=torch.float32, device=self.device)
            if step.want_probs
            else None
        )
        last = base + step.num_spec  # the last position the request's scheduled tokens reach
        for j in range(step.max_spec):
            valid = step.num_spec > j  # d_{j+1} is scheduled: its position has a block and a cell
            # A draft past the scheduled ones is still drawn, at a position clamped into the
            # table (its penalty counts read the row only) and never stored.
            pos = torch.clamp(base + (1 + j), max=width - 1)
            tokens, q = self._sample(step, logits, pos)
            drafts[:, j] = tokens
            if probs is not None and q is not None:
                probs[:, j] = q
            _write_tokens(step.token_ids, step.rows, pos, tokens, valid)
            if j + 1 < step.max_spec:
                # d_{j+1} at its position; a request without it re-reads its last scheduled
                # position (its blocks are reserved) and writes nothing.
                logits = self._forward(step, 1, torch.minimum(base + (1 + j), last), valid)
        return drafts, probs

    # ---- internals ---------------------------------------------------------------------
    def _forward(
        self, step: DraftStep, q: int, start: torch.Tensor, valid: torch.Tensor | None
    ) -> torch.Tensor:
        # q tokens per request from position start[i] ([m] int32), read from the token table;
        # the draft's logits at each request's last token ([m, vocab] float32).
        m = step.num_reqs
        graphs = self.graphs.get(q)
        size = graphs.padded_size(m) if graphs is not None else None
        md = self._prepare(step, q, start, size)
        if valid is not None:  # positions past the scheduled drafts: no reserved slot
            slots = self.slot_mapping[:m]
            slots.copy_(torch.where(valid, slots, torch.full_like(slots, -1)))
        if size is not None:
            self.num_graph_forwards += 1
            hidden = graphs.replay(size)  # type: ignore[union-attr]
        else:
            self.num_eager_forwards += 1
            t = m * q
            hidden = self.model(self.input_ids[:t], self.positions[:t], self.kv_caches, md)
        return self.model.compute_logits(hidden.index_select(0, self.logits_indices[:m]))

    def _prepare(
        self, step: DraftStep, q: int, start: torch.Tensor, size: int | None
    ) -> AttentionMetadata:
        m, width = step.num_reqs, self.config.max_model_len
        r_pad = size if size is not None else m
        t_pad = r_pad * q
        qsl, positions = self.query_start_loc[: r_pad + 1], self.positions[:t_pad]
        prepare_query_start_loc(self._query_lens[q], m, qsl)
        # start is by batch position (idx_mapping 0..m-1 for it); every other kernel by row.
        prepare_positions(self._arange[:m], start, qsl, m, positions, self.seq_lens[:r_pad])
        prepare_input_ids(
            step.rows,
            qsl,
            positions,
            self._from_table,
            self._from_table,
            step.token_ids,
            m,
            self.input_ids[:t_pad],
        )
        compute_slot_mapping(
            step.rows,
            qsl,
            positions,
            step.block_table,
            self.config.block_size,
            m,
            self.slot_mapping[:t_pad],
        )
        compute_logits_indices(qsl, m, self.logits_indices[:m])
        torch.index_select(step.block_table, 0, step.rows, out=self.block_table[:m])
        host_max = min(int(step.num_computed_np[step.rows_np].max(initial=0)) + self.k + 1, width)
        return AttentionMetadata(
            query_start_loc=qsl,
            seq_lens=self.seq_lens[:r_pad],
            block_table=self.block_table[:r_pad],
            slot_mapping=self.slot_mapping[:t_pad],
            max_query_len=q,
            max_seq_len=width if size is not None else host_max,
            num_actual_tokens=m * q,
            block_size=self.config.block_size,
        )

    def _sample(
        self, step: DraftStep, logits: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The request's own sampling at the draft's position (docs/sampling.md), and q.
        m, vocab = logits.shape
        counts = None
        if step.use_penalties:
            counts = torch.zeros(m, vocab, dtype=torch.int32, device=self.device)
            t = step.tables
            build_penalty_counts(
                step.rows,
                pos,
                step.token_ids,
                t.num_prompt_tokens,
                t.repetition_penalty,
                t.frequency_penalty,
                t.presence_penalty,
                counts,
            )
        tokens = torch.empty(m, dtype=torch.int32, device=self.device)
        gumbel_sample(logits, step.rows, pos, step.tables, counts, tokens)
        if not step.want_probs:
            return tokens, None
        q = torch.empty(m, vocab, dtype=torch.float32, device=self.device)
        compute_probs(logits, step.rows, pos, step.tables, counts, q)
        return tokens, q


def _write_tokens(
    token_ids: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    valid: torch.Tensor,
) -> None:
    # token_ids[rows, positions] = tokens where valid, as one gather and one scatter on the
    # device (no host sync: the invalid entries write back what their cell holds).
    width = token_ids.shape[1]
    flat = rows.to(torch.int64) * width + torch.clamp(positions, max=width - 1).to(torch.int64)
    table = token_ids.view(-1)
    table.index_copy_(0, flat, torch.where(valid, tokens, table.index_select(0, flat)))


__all__ = ["DraftModelProposer", "DraftStep", "load_draft_model"]
