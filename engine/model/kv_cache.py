"""Paged KV caches: one tensor per decoder layer, ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` (keys at index 0, values at 1), written by ``slot_mapping`` (``-1`` = skip)."""

from __future__ import annotations

import torch

from engine.model.config import ModelConfig


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over all layers (keys + values), to size ``num_blocks``."""
    per_layer = 2 * block_size * config.num_key_value_heads * config.head_dim
    return per_layer * config.num_hidden_layers * torch.empty((), dtype=dtype).element_size()


def allocate_kv_caches(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:  # num_hidden_layers x [2, num_blocks, block_size, H_kv, head_dim]
    """Zeroed KV caches for every layer of a decoder.

    Raises:
        ValueError: an encoder config, or a non-positive ``num_blocks`` / ``block_size``.
    """
    if config.is_encoder:
        raise ValueError(f"{config.architecture} is an encoder: it keeps no KV cache")
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
    shape = (2, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device)
            for _ in range(config.num_hidden_layers)]
