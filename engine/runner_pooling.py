"""The pooling step both runners share: the whole prompt of every scheduled pooling request in
one forward (a pooling request is never chunked), and one pooled vector per request.

- Encoders (``BertModel``, ``BertForSequenceClassification``): prompts right-padded to the
  longest, with an attention mask and the token types, through dense masked attention
  (:func:`pool_encoder`); no KV cache.
- Pooling decoders (``LlamaForSequenceClassification``): the prompts packed as one prefill
  through the paged-attention path, into :class:`PoolingKVScratch`, a step-local paged cache
  sized to one step's work (``max_num_batched_tokens`` tokens, plus one partial block per
  request); nothing in it outlives the step, every key a query reads is written in the same
  forward first. The head reads the hidden state of each prompt's last token
  (:func:`pool_decoder`).

Inputs cross to the device in one copy per dtype (from pinned memory, non-blocking, on CUDA: no
host sync). Imported by the runner wiring only (torch).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from turnout.engine.kv_cache_manager import cdiv
from turnout.engine.model import (
    AttentionMetadata,
    DecoderModel,
    EncoderModel,
    LlamaForSequenceClassification,
    allocate_kv_caches,
)


def to_device(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``; on CUDA through pinned memory, without a host sync."""
    tensor = torch.from_numpy(host)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def pool_encoder(
    model: EncoderModel,
    prompts: Sequence[Sequence[int]],
    token_type_ids: Sequence[Sequence[int] | None],  # per prompt, None: all 0
    device: torch.device,
) -> torch.Tensor:  # [num_prompts, pooled_dim] float32 on ``device``
    """``model.pool`` of ``prompts`` in one encoder forward (embeddings, or classification
    logits), right-padded to the longest with an attention mask."""
    width = max(len(p) for p in prompts)
    host = np.zeros((3, len(prompts), width), np.int64)  # [ids, mask, token types]
    for i, (prompt, types) in enumerate(zip(prompts, token_type_ids, strict=True)):
        host[0, i, : len(prompt)] = prompt
        host[1, i, : len(prompt)] = 1
        if types is not None:
            host[2, i, : len(prompt)] = types
    both = to_device(host, device)
    with_types = any(t is not None for t in token_type_ids)
    return model.pool(both[0], both[1], both[2] if with_types else None).float()


class PoolingKVScratch:
    """A paged KV cache for one pooling step of a decoder: every scheduled prompt is laid out
    from a fresh block, blocks of the step back to back.

    Args:
        model: the pooling decoder (its ``kv_cache_spec`` gives the layout).
        max_num_tokens: tokens of one step at most (``max_num_batched_tokens``).
        max_num_seqs: requests of one step at most (each may leave one block partly empty).

    Attributes:
        kv_caches: per layer, ``spec.layer_shape(num_blocks, block_size)`` in the model dtype.
    """

    def __init__(
        self,
        model: DecoderModel,
        *,
        max_num_tokens: int,
        max_num_seqs: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = cdiv(max_num_tokens, block_size) + max_num_seqs
        self.kv_caches = allocate_kv_caches(
            model.kv_cache_spec, self.num_blocks, block_size, dtype, device
        )

    def metadata(
        self, lengths: Sequence[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """``positions [T] int64``, ``last [n] int64`` (each prompt's last packed row) and the
        attention metadata of one prefill of prompts of ``lengths``.

        Raises:
            ValueError: the prompts need more blocks than the scratch holds.
        """
        bs = self.block_size
        lens = np.asarray(lengths, np.int64)
        blocks = -(-lens // bs)
        if int(blocks.sum()) > self.num_blocks:
            raise ValueError(
                f"{int(blocks.sum())} KV blocks needed, the pooling scratch has {self.num_blocks}"
            )
        first_block = np.concatenate([[0], np.cumsum(blocks)[:-1]])
        cu = np.concatenate([[0], np.cumsum(lens)])
        starts = np.repeat(cu[:-1], lens)
        positions = np.arange(int(cu[-1])) - starts
        slots = np.repeat(first_block * bs, lens) + positions
        width = int(blocks.max())
        table = first_block[:, None] + np.arange(width)[None, :]
        table = np.where(np.arange(width)[None, :] < blocks[:, None], table, 0)
        host64 = to_device(np.concatenate([positions, slots, cu[1:] - 1]), device)
        host32 = to_device(np.concatenate([cu, lens, table.ravel()]).astype(np.int32), device)
        n, t = len(lens), int(cu[-1])
        md = AttentionMetadata(
            query_start_loc=host32[: n + 1],
            seq_lens=host32[n + 1 : 2 * n + 1],
            block_table=host32[2 * n + 1 :].view(n, width),
            slot_mapping=host64[t : 2 * t],
            max_query_len=int(lens.max()),
            max_seq_len=int(lens.max()),
            num_actual_tokens=t,
            block_size=bs,
        )
        return host64[:t], host64[2 * t :], md


def pool_decoder(
    model: LlamaForSequenceClassification,
    scratch: PoolingKVScratch,
    prompts: Sequence[Sequence[int]],
    device: torch.device,
) -> torch.Tensor:  # [num_prompts, num_labels] float32 on ``device``
    """The head of ``model`` (``LlamaForSequenceClassification.pool``) at the last token of
    each prompt, all prompts in one causal prefill through the paged-attention path."""
    ids = to_device(np.concatenate([np.asarray(p, np.int64) for p in prompts]), device)
    positions, last, md = scratch.metadata([len(p) for p in prompts], device)
    hidden = model(ids, positions, scratch.kv_caches, md)
    return model.pool(hidden.index_select(0, last))


__all__ = ["PoolingKVScratch", "pool_decoder", "pool_encoder", "to_device"]
