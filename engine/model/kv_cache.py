"""Paged KV caches: what each decoder layer keeps per token is declared by its model as a
:class:`KVCacheSpec`, so the runners size and allocate any model's cache the same way.

- :class:`FullAttentionSpec` (Llama family): ``[2, num_blocks, block_size, num_kv_heads,
  head_dim]`` per layer, keys at index 0 and values at 1.
- :class:`MLAAttentionSpec` (DeepSeek-V2): ``[num_blocks, block_size, kv_lora_rank +
  qk_rope_head_dim]`` per layer, the compressed KV then the shared rotary key of each token.

A model class declares its spec with ``kv_cache_spec_for(config)`` (a built model:
``model.kv_cache_spec``). Caches are written by ``slot_mapping`` (``-1`` = skip). The names
follow vLLM's ``vllm/v1/kv_cache_interface.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnout.engine.model.config import ModelConfig


@dataclass(frozen=True)
class KVCacheSpec:
    """The paged cache of every layer of one model: ``num_layers`` tensors of one shape."""

    num_layers: int

    @property
    def values_per_token(self) -> int:
        """Values one token keeps in one layer's cache."""
        raise NotImplementedError

    def layer_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of one layer's cache tensor."""
        raise NotImplementedError

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block of ``block_size`` slots takes over all layers."""
        element = torch.empty((), dtype=dtype).element_size()
        return self.values_per_token * block_size * self.num_layers * element


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    """Keys and values of every kv head: ``2 * num_kv_heads * head_dim`` values a token."""

    num_kv_heads: int
    head_dim: int

    @property
    def values_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim

    def layer_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True)
class MLAAttentionSpec(KVCacheSpec):
    """Multi-head latent attention: one latent row ``[c_kv, k_pe]`` a token, shared by all heads
    (``kv_lora_rank + qk_rope_head_dim`` values: 576 for DeepSeek-V2 and V2-Lite)."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def values_per_token(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def layer_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.values_per_token)


def kv_cache_spec(config: ModelConfig) -> KVCacheSpec:
    """The spec ``config``'s model class declares.

    Raises:
        ValueError: an encoder config (it keeps no KV cache).
    """
    if config.is_encoder:
        raise ValueError(f"{config.architecture} is an encoder: it keeps no KV cache")
    from turnout.engine.model.registry import decoder_class  # the model classes import this module

    return decoder_class(config).kv_cache_spec_for(config)


def _spec(spec: KVCacheSpec | ModelConfig) -> KVCacheSpec:
    return spec if isinstance(spec, KVCacheSpec) else kv_cache_spec(spec)


def kv_cache_bytes_per_block(
    spec: KVCacheSpec | ModelConfig, block_size: int, dtype: torch.dtype
) -> int:
    """Bytes one KV block takes over all layers, to size ``num_blocks`` (a config is resolved
    to its model's spec)."""
    return _spec(spec).bytes_per_block(block_size, dtype)


def allocate_kv_caches(
    spec: KVCacheSpec | ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:  # num_layers x spec.layer_shape(num_blocks, block_size)
    """Zeroed KV caches for every layer of a decoder (a config is resolved to its model's spec).

    Raises:
        ValueError: an encoder config, or a non-positive ``num_blocks`` / ``block_size``.
    """
    spec = _spec(spec)
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
    shape = spec.layer_shape(num_blocks, block_size)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
