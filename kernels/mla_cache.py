"""The latent cache write of multi-head latent attention (DeepSeek-V2): each token's row
``[c_kv, k_pe]`` (``kv_lora_rank + qk_rope_head_dim`` values) goes to its slot of the paged
latent cache ``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]`` (``slot_mapping``;
``-1`` marks padding and is skipped), vLLM's op of the same name. The attention over that
cache is ``kernels.mla_attention``.
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_vector
from turnout.kernels._triton import require_triton, tl, triton


@triton.jit  # type: ignore[untyped-decorator]
def _concat_and_cache_mla_kernel(  # type: ignore[no-untyped-def]
    kv_c_ptr,
    k_pe_ptr,
    kv_cache_ptr,
    slot_mapping_ptr,
    kv_c_stride,
    k_pe_stride,
    cache_stride_slot,
    KV_LORA_RANK: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:  # padding token of a CUDA-graph batch: nothing to write
        return
    t = token.to(tl.int64)
    dst = kv_cache_ptr + slot.to(tl.int64) * cache_stride_slot
    c = tl.arange(0, BLOCK_C)
    tl.store(
        dst + c,
        tl.load(kv_c_ptr + t * kv_c_stride + c, mask=c < KV_LORA_RANK),
        mask=c < KV_LORA_RANK,
    )
    r = tl.arange(0, BLOCK_R)
    tl.store(
        dst + KV_LORA_RANK + r,
        tl.load(k_pe_ptr + t * k_pe_stride + r, mask=r < ROPE_DIM),
        mask=r < ROPE_DIM,
    )


def concat_and_cache_mla(
    kv_c: torch.Tensor,  # [num_tokens, kv_lora_rank], normalised compressed KV
    k_pe: torch.Tensor,  # [num_tokens, rope_dim], rotary key after RoPE
    kv_cache: torch.Tensor,  # [num_blocks, block_size, kv_lora_rank + rope_dim], written
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Write each token's latent row ``[kv_c, k_pe]`` at its slot (Triton; one program a token).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    require_triton()
    _check_latent_write(kv_c, k_pe, kv_cache, slot_mapping)
    if kv_c.shape[0] == 0:
        return
    rank, rope_dim = kv_c.shape[1], k_pe.shape[1]
    _concat_and_cache_mla_kernel[(kv_c.shape[0],)](
        kv_c,
        k_pe,
        kv_cache,
        slot_mapping,
        kv_c.stride(0),
        k_pe.stride(0),
        kv_cache.stride(1),
        KV_LORA_RANK=rank,
        ROPE_DIM=rope_dim,
        BLOCK_C=triton.next_power_of_2(rank),
        BLOCK_R=triton.next_power_of_2(rope_dim),
    )


def concat_and_cache_mla_ref(
    kv_c: torch.Tensor,  # [num_tokens, kv_lora_rank]
    k_pe: torch.Tensor,  # [num_tokens, rope_dim]
    kv_cache: torch.Tensor,  # [num_blocks, block_size, kv_lora_rank + rope_dim], written
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Torch reference of :func:`concat_and_cache_mla` (boolean indexing: syncs on CUDA).

    Raises:
        ValueError: shapes, dtypes or strides do not match the annotations.
    """
    _check_latent_write(kv_c, k_pe, kv_cache, slot_mapping)
    valid = slot_mapping >= 0
    kv_cache.view(-1, kv_cache.shape[2])[slot_mapping[valid]] = torch.cat(
        [kv_c[valid], k_pe[valid]], dim=1
    )


def _check_latent_write(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    if (
        kv_c.dim() != 2
        or k_pe.dim() != 2
        or kv_cache.dim() != 3
        or kv_c.shape[0] != k_pe.shape[0]
        or kv_c.shape[1] + k_pe.shape[1] != kv_cache.shape[2]
    ):
        raise ValueError(
            f"kv_c {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)} do not fit "
            f"kv_cache {tuple(kv_cache.shape)} ([T, rank] + [T, rope] -> rank + rope)"
        )
    if kv_c.dtype != kv_cache.dtype or k_pe.dtype != kv_cache.dtype:
        raise ValueError(f"kv_c/k_pe dtype must equal kv_cache dtype {kv_cache.dtype}")
    check_vector("slot_mapping", slot_mapping, torch.int64, kv_c.shape[0])
    if not kv_cache.is_contiguous() or kv_c.stride(1) != 1 or k_pe.stride(1) != 1:
        raise ValueError("kv_cache must be contiguous and kv_c/k_pe need a unit last stride")


__all__ = ["concat_and_cache_mla", "concat_and_cache_mla_ref"]
