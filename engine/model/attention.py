"""Attention over paged KV caches, driven only by an explicit :class:`AttentionMetadata`.

The backend is chosen per call from the device (``"auto"``): CUDA tensors go to the Triton
kernels of ``kernels.paged_attention``, CPU tensors to their torch references. ``"triton"``
forces the kernels (on CPU through ``TRITON_INTERPRET=1``, for tests) and ``"torch"`` the
references.
"""

from __future__ import annotations

import torch

from engine.model.attention_metadata import AttentionMetadata
from kernels import paged_attention as pa
from kernels._triton import HAS_TRITON

ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend == "auto":
        return device.type == "cuda" and HAS_TRITON
    return backend == "triton"


def paged_attention_forward(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], written
    attn_metadata: AttentionMetadata,
    *,
    scale: float,
    sliding_window: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Write this step's keys/values by ``slot_mapping``, then attend over the paged cache.

    Raises:
        ValueError: the metadata is not causal, or shapes/dtypes do not fit the cache.
    """
    if not attn_metadata.causal:
        raise ValueError("paged attention serves decoders: attn_metadata.causal must be True")
    md = attn_metadata
    out = torch.zeros_like(query)  # padding rows stay zero (never NaN garbage)
    if _use_triton(backend, query.device):
        pa.reshape_and_cache(key, value, kv_cache, md.slot_mapping)
        pa.paged_attention(query, kv_cache, md.query_start_loc, md.seq_lens, md.block_table,
                           md.max_query_len, scale, sliding_window, out=out)
    else:
        pa.reshape_and_cache_ref(key, value, kv_cache, md.slot_mapping)
        pa.paged_attention_ref(query, kv_cache, md.query_start_loc, md.seq_lens, md.block_table,
                               md.max_query_len, scale, sliding_window, out=out)
    return out
