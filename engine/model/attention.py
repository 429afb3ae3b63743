"""Attention over paged KV caches, driven only by an explicit :class:`AttentionMetadata`:
keys and values per kv head (``paged_attention_forward``), or the latent rows of multi-head
latent attention (``mla_attention_forward``).

The backend is chosen per call from the device (``"auto"``): CUDA tensors go to the Triton
kernels of ``kernels.paged_attention`` (split-KV decoding, ``kernels.paged_attention_split``,
for decode steps of few requests), CPU tensors to their torch references. ``"triton"``
forces the kernels (on CPU through ``TRITON_INTERPRET=1``, for tests) and ``"torch"`` the
references.
"""

from __future__ import annotations

import torch

from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.kernels import mla_attention as mla
from turnout.kernels import mla_cache
from turnout.kernels import paged_attention as pa
from turnout.kernels import paged_attention_split as pa_split
from turnout.kernels._triton import HAS_TRITON

ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")

#: A decode step (one query per request) runs split-KV while it has fewer (request, kv head)
#: programs than this (two waves of an H200's 132 SMs): below it the unified kernel leaves
#: SMs idle while each program walks the whole context. Host ints only, so graph-safe.
SPLIT_KV_MAX_PROGRAMS = 2 * 132


def use_split_kv(max_query_len: int, num_reqs: int, num_kv_heads: int) -> bool:
    """Whether a step runs the split-KV decode kernel (host facts, fixed per CUDA graph)."""
    return max_query_len == 1 and num_reqs * num_kv_heads < SPLIT_KV_MAX_PROGRAMS


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
    kv_written: bool = False,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Write this step's keys/values by ``slot_mapping`` (unless ``kv_written``: the fused RoPE
    kernel of ``kernels/rotary.py`` wrote them already), then attend over the paged cache.

    Raises:
        ValueError: the metadata is not causal, or shapes/dtypes do not fit the cache.
    """
    if not attn_metadata.causal:
        raise ValueError("paged attention serves decoders: attn_metadata.causal must be True")
    md = attn_metadata
    if _use_triton(backend, query.device):
        if not kv_written:
            pa.reshape_and_cache(key, value, kv_cache, md.slot_mapping)
        args = (
            query,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            md.max_query_len,
            scale,
            sliding_window,
        )
        if use_split_kv(md.max_query_len, md.seq_lens.shape[0], kv_cache.shape[3]):
            out = torch.zeros_like(query)  # padding rows stay zero (never NaN garbage)
            pa_split.paged_attention_split(*args, out=out)
        else:  # the kernel zeroes the padding rows itself: no fill of the whole output
            out = pa.paged_attention(*args, out=torch.empty_like(query), zero_padding=True)
    else:
        out = torch.zeros_like(query)  # padding rows stay zero (never NaN garbage)
        if not kv_written:
            pa.reshape_and_cache_ref(key, value, kv_cache, md.slot_mapping)
        pa.paged_attention_ref(
            query,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            md.max_query_len,
            scale,
            sliding_window,
            out=out,
        )
    return out


def mla_attention_forward(
    query: torch.Tensor,  # [num_tokens, num_heads, kv_lora_rank + rope_dim], latent queries
    kv_c: torch.Tensor,  # [num_tokens, kv_lora_rank], this step's normalised compressed KV
    k_pe: torch.Tensor,  # [num_tokens, rope_dim], this step's rotary keys (after RoPE)
    kv_cache: torch.Tensor,  # [num_blocks, block_size, kv_lora_rank + rope_dim], written
    attn_metadata: AttentionMetadata,
    *,
    scale: float,
    backend: str = "auto",
) -> torch.Tensor:  # [num_tokens, num_heads, kv_lora_rank], latent outputs
    """Write this step's latent rows by ``slot_mapping``, then attend in the latent space over
    the paged cache (``kernels.mla_cache``, ``kernels.mla_attention``).

    Raises:
        ValueError: the metadata is not causal, or shapes/dtypes do not fit the cache.
    """
    if not attn_metadata.causal:
        raise ValueError("MLA attention serves decoders: attn_metadata.causal must be True")
    md = attn_metadata
    rank = kv_c.shape[1]
    out = query.new_zeros(query.shape[0], query.shape[1], rank)  # padding rows stay zero
    if _use_triton(backend, query.device):
        mla_cache.concat_and_cache_mla(kv_c, k_pe, kv_cache, md.slot_mapping)
        mla.mla_attention(
            query,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            md.max_query_len,
            scale,
            rank,
            out=out,
        )
    else:
        mla_cache.concat_and_cache_mla_ref(kv_c, k_pe, kv_cache, md.slot_mapping)
        mla.mla_attention_ref(
            query,
            kv_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            md.max_query_len,
            scale,
            rank,
            out=out,
        )
    return out
