"""The per-step attention inputs, passed explicitly to every attention layer (no global state).

Both runners build one :class:`AttentionMetadata` per forward pass; the model layer only reads
it. Tokens of a step are laid out request after request (varlen, "packed"): request ``i`` owns
the query tokens ``query_start_loc[i]:query_start_loc[i + 1]``. Field names follow vLLM's
``FlashAttentionMetadata`` (vLLM PR #9933 and successors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Inputs of paged attention for one step.

    Attributes:
        query_start_loc: ``[num_reqs + 1] int32`` cumulative query lengths (``cu_seqlens_q``),
            ``query_start_loc[0] == 0``, ``query_start_loc[-1] == num_actual_tokens``.
        seq_lens: ``[num_reqs] int32`` tokens in each request's context after this step
            (``num_computed_tokens + num_scheduled_tokens``), i.e. the keys attended to.
        block_table: ``[num_reqs, max_num_blocks_per_req] int32`` physical KV block ids, row
            ``i`` for request ``i`` of the batch; unused entries are ignored.
        slot_mapping: ``[num_tokens] int64`` KV slot (``block_id * block_size + offset``) where
            each token's key/value is written; ``-1`` for padding tokens (never written).
        max_query_len: longest query of the step (host int, sizes the kernel grid).
        max_seq_len: longest ``seq_lens`` entry (host int).
        num_actual_tokens: tokens that belong to requests; a CUDA-graph batch may be padded
            beyond it (the padding has ``slot_mapping == -1``).
        block_size: tokens per KV block.
        causal: ``True`` for decoders; ``False`` for the BERT encoder (no KV cache then:
            ``block_table`` and ``slot_mapping`` may be empty).
        state_indices: ``[num_reqs] int32`` slot of each request's recurrent state in the
            Mamba layers' caches (``engine.model.state_cache``); ``None`` for models without
            one. runner_v2 passes its row index (rows never move), runner_v1 a slot it keeps
            per request.
        all_states_continue: host bool, with ``state_indices``: no request of the step starts
            at position 0 (each continues from its stored state), so a step of one token per
            request may use the Mamba layers' one-token decode kernels.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    block_size: int
    causal: bool = True
    state_indices: torch.Tensor | None = None
    all_states_continue: bool = False

    @property
    def num_reqs(self) -> int:
        """Requests in the step (``query_start_loc`` has one more entry)."""
        return int(self.query_start_loc.shape[0]) - 1
