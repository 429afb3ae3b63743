"""MLA latent attention and the latent cache write: the torch reference against attention with
the keys and values expanded per head (the un-absorbed form HF transformers computes), the
Triton kernels against the references (small shapes through TRITON_INTERPRET=1 on CPU; the
`gpu` tests at DeepSeek-V2-Lite's and DeepSeek-V2's layouts in bf16)."""

from __future__ import annotations

import pytest
import torch

from turnout.kernels._triton import HAS_TRITON
from turnout.kernels.mla_attention import (
    MAX_KV_SPLITS,
    mla_attention,
    mla_attention_ref,
    mla_tiles,
    num_kv_splits_for,
)
from turnout.kernels.mla_cache import concat_and_cache_mla, concat_and_cache_mla_ref

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    *,
    num_heads: int,
    rank: int,
    rope: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> dict[str, object]:
    """A packed step over a latent cache: request i has ctx_lens[i] cached tokens and q_lens[i]
    new ones, its blocks scattered over the cache (a random permutation of block ids)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens, strict=True)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(q_lens), max(blocks_per_req) + 2, dtype=torch.int32)
    for i, n in enumerate(blocks_per_req):
        table[i, :n] = torch.tensor([perm.pop() for _ in range(n)])
    num_tokens = sum(q_lens)
    return dict(
        query=torch.randn(num_tokens, num_heads, rank + rope, generator=gen).to(dtype).to(device),
        kv_cache=torch.randn(num_blocks, block_size, rank + rope, generator=gen)
        .to(dtype)
        .to(device),
        query_start_loc=torch.tensor(
            [0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
        ),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=table.to(device),
        max_query_len=max(q_lens),
        scale=(rank + rope) ** -0.5 * 1.3,
        kv_lora_rank=rank,
    )


def expanded_attention(
    b: dict[str, object], nope: int, v_dim: int, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent check of the latent form: random per-head up-projections W_UK [H, nope, rank]
    and W_UV [H, v, rank]; queries q_nope are drawn, the latent query is q_nope @ W_UK; keys and
    values are expanded per head from each cached latent row and attended with SDPA. Returns
    (latent reference output mapped through W_UV, expanded output), both [T, H, v]."""
    q_all, cache = b["query"], b["kv_cache"]
    assert isinstance(q_all, torch.Tensor) and isinstance(cache, torch.Tensor)
    rank, heads = int(b["kv_lora_rank"]), q_all.shape[1]  # type: ignore[call-overload]
    gen = torch.Generator().manual_seed(seed)
    w_uk = torch.randn(heads, nope, rank, generator=gen) / rank**0.5
    w_uv = torch.randn(heads, v_dim, rank, generator=gen) / rank**0.5
    q_nope = torch.randn(q_all.shape[0], heads, nope, generator=gen)
    q_latent = torch.einsum("thn,hnc->thc", q_nope, w_uk)
    query = torch.cat([q_latent, q_all[..., rank:].float()], dim=-1)
    latent_out = mla_attention_ref(**{**b, "query": query, "kv_cache": cache.float()})  # type: ignore[arg-type]
    via_latent = torch.einsum("thc,hvc->thv", latent_out, w_uv)
    qsl, seq_lens, table = b["query_start_loc"], b["seq_lens"], b["block_table"]
    block_size = cache.shape[1]
    out = torch.empty(q_all.shape[0], heads, v_dim)
    for i, seq_len in enumerate(seq_lens.tolist()):  # type: ignore[union-attr]
        s, e = qsl[i].item(), qsl[i + 1].item()  # type: ignore[index]
        slots = [
            table[i, p // block_size].item() * block_size + p % block_size  # type: ignore[index]
            for p in range(seq_len)
        ]
        rows = cache.flatten(0, 1)[slots].float()
        k = torch.cat(
            [
                torch.einsum("kc,hnc->hkn", rows[:, :rank], w_uk),
                rows[None, :, rank:].expand(heads, -1, -1),
            ],
            dim=-1,
        )
        v = torch.einsum("kc,hvc->hkv", rows[:, :rank], w_uv)
        q = torch.cat([q_nope[s:e], q_all[s:e, :, rank:].float()], dim=-1).transpose(0, 1)
        pos_q = torch.arange(seq_len - (e - s), seq_len)[:, None]
        mask = torch.arange(seq_len)[None] <= pos_q
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=b["scale"]
        )  # type: ignore[arg-type]
        out[s:e] = o.transpose(0, 1)
    return via_latent, out


# (q_lens, ctx_lens): prefill, chunked prefill continuation, decodes, all mixed.
SMALL_CASES = {
    "mixed": ([7, 1, 5, 1], [0, 12, 9, 3]),
    "decode-only": ([1, 1, 1], [0, 17, 30]),
    "one-long-prefill": ([37], [0]),
}
LAYOUTS = {  # (num_heads, kv_lora_rank, rope_dim, block_size)
    "h4-r32-p8-b4": (4, 32, 8, 4),  # fewer heads than a tile's 16 rows
    "h16-r64-p16-b16": (16, 64, 16, 16),  # a full 16-head decode tile
    "h20-r48-p8-b5": (20, 48, 8, 5),  # two head groups, rank and block_size not powers of 2
}


@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_reference_equals_expanded_attention(case: str) -> None:
    b = make_batch(
        *SMALL_CASES[case],
        num_heads=4,
        rank=32,
        rope=8,
        block_size=4,
        dtype=torch.float32,
        device="cpu",
    )
    via_latent, expanded = expanded_attention(b, nope=16, v_dim=12)
    torch.testing.assert_close(via_latent, expanded, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_kernel_equals_reference_small(case: str, layout: str) -> None:
    heads, rank, rope, block_size = LAYOUTS[layout]
    b = make_batch(
        *SMALL_CASES[case],
        num_heads=heads,
        rank=rank,
        rope=rope,
        block_size=block_size,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    query = b["query"]
    assert isinstance(query, torch.Tensor)
    out = torch.full((query.shape[0], heads, rank), float("nan"), device=KERNEL_DEVICE)
    mla_attention(**b, out=out)  # type: ignore[arg-type]
    torch.testing.assert_close(out, mla_attention_ref(**b), atol=1e-5, rtol=1e-5)  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("num_kv_splits", [2, 4, 64])
def test_split_decode_equals_reference(num_kv_splits: int) -> None:
    # Flash-decoding: each request's keys in slices, merged by log-sum-exp; contexts from 1
    # key (most slices empty) to 70, block_size 5 so slices start inside blocks.
    b = make_batch(
        [1, 1, 1, 1],
        [0, 3, 30, 69],
        num_heads=20,
        rank=48,
        rope=8,
        block_size=5,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    torch.testing.assert_close(
        mla_attention(**b, num_kv_splits=num_kv_splits),  # type: ignore[arg-type]
        mla_attention_ref(**b),
        atol=1e-5,
        rtol=1e-5,
    )  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_kernel_leaves_padding_rows_alone(num_kv_splits: int) -> None:
    # A CUDA-graph batch is padded past query_start_loc[-1]: those rows must stay untouched.
    q_lens = [3, 1] if num_kv_splits == 1 else [1, 1]  # split decode: decode batches only
    b = make_batch(
        q_lens,
        [0, 5],
        num_heads=4,
        rank=32,
        rope=8,
        block_size=4,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    q = b["query"]
    assert isinstance(q, torch.Tensor)
    n = q.shape[0]
    b["query"] = torch.cat([q, torch.randn(2, *q.shape[1:], device=q.device)])
    out = torch.full((n + 2, 4, 32), 7.0, device=KERNEL_DEVICE)
    mla_attention(**b, out=out, num_kv_splits=num_kv_splits)  # type: ignore[arg-type]
    assert (out[n:] == 7.0).all()
    torch.testing.assert_close(out[:n], mla_attention_ref(**b)[:n])  # type: ignore[arg-type]


def test_split_counts_follow_the_batch_not_the_contexts() -> None:
    assert num_kv_splits_for(1, 1, torch.device("cpu")) == 1  # no split off CUDA
    if torch.cuda.is_available():
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert num_kv_splits_for(1, 1, torch.device("cuda")) == MAX_KV_SPLITS
        assert num_kv_splits_for(2 * sms, 1, torch.device("cuda")) == 1


def test_tiles_pack_heads_of_one_query_for_decode() -> None:
    assert mla_tiles(16, 1) == (16, 1, 16, 32)  # V2-Lite decode: 16 heads of one token
    assert mla_tiles(128, 1) == (16, 1, 16, 32)  # DeepSeek-V2: 8 head groups
    assert mla_tiles(16, 300) == (16, 4, 64, 64)  # prefill: four queries x 16 heads
    assert mla_tiles(16, 300, torch.float32) == (16, 2, 32, 16)
    assert mla_tiles(4, 1) == (4, 4, 16, 32)  # at least 16 rows


def _latent_write_inputs(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    kv_a = torch.randn(9, 48 + 8, generator=gen).to(dtype).to(device)
    kv_c, k_pe = kv_a[:, :48], kv_a[:, 48:]  # strided views, as the projection's split gives
    slots = torch.tensor([0, 5, -1, 7, 100, 3, -1, 9, 11], dtype=torch.int64, device=device)
    return kv_c, k_pe, torch.zeros(26, 4, 56, dtype=dtype, device=device), slots


def test_concat_and_cache_ref_writes_slots_and_skips_padding() -> None:
    kv_c, k_pe, cache, slots = _latent_write_inputs("cpu", torch.float32)
    concat_and_cache_mla_ref(kv_c, k_pe, cache, slots)
    assert torch.equal(cache[100 // 4, 100 % 4], torch.cat([kv_c[4], k_pe[4]]))
    assert torch.equal(cache[1, 3, 48:], k_pe[3])  # slot 7
    assert int((cache.flatten(0, 1).abs().sum(1) > 0).sum()) == 7  # two -1 skipped


@needs_triton
def test_concat_and_cache_kernel_equals_reference() -> None:
    kv_c, k_pe, cache, slots = _latent_write_inputs(KERNEL_DEVICE, torch.float32)
    want = cache.clone()
    concat_and_cache_mla_ref(kv_c, k_pe, want, slots)
    concat_and_cache_mla(kv_c, k_pe, cache, slots)
    assert torch.equal(cache, want)


def test_bad_arguments_are_named() -> None:
    b = make_batch(
        [2], [0], num_heads=4, rank=32, rope=8, block_size=4, dtype=torch.float32, device="cpu"
    )
    with pytest.raises(ValueError, match="seq_lens must be int32"):
        mla_attention_ref(**{**b, "seq_lens": b["seq_lens"].long()})  # type: ignore[arg-type, union-attr]
    with pytest.raises(ValueError, match="dtype"):
        mla_attention_ref(**{**b, "query": b["query"].half()})  # type: ignore[arg-type, union-attr]
    with pytest.raises(ValueError, match="kv_lora_rank"):
        mla_attention_ref(**{**b, "kv_lora_rank": 40})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out must be"):
        mla_attention_ref(**b, out=torch.zeros(2, 4, 40))  # type: ignore[arg-type]
    if HAS_TRITON:
        with pytest.raises(ValueError, match="num_kv_splits must be a power of two"):
            mla_attention(**b, num_kv_splits=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="splits decode batches only"):
            mla_attention(**b, num_kv_splits=2)  # type: ignore[arg-type]
    kv_c, k_pe, cache, slots = _latent_write_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        concat_and_cache_mla_ref(kv_c, k_pe, cache, slots.int())
    with pytest.raises(ValueError, match="do not fit"):
        concat_and_cache_mla_ref(kv_c, k_pe[:, :4], cache, slots)


# --- GPU: real layouts in bf16 -------------------------------------------------------------
GPU_LAYOUTS = {  # (num_heads, kv_lora_rank, qk_rope_head_dim): real configs
    "deepseek-v2-lite": (16, 512, 64),
    "deepseek-v2": (128, 512, 64),
}


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("layout", sorted(GPU_LAYOUTS))
def test_kernel_equals_reference_bf16_gpu(layout: str, block_size: int) -> None:
    heads, rank, rope = GPU_LAYOUTS[layout]
    # 4 prefills (one chunked onto 700 cached tokens) and 60 decodes with contexts to 4k.
    gen = torch.Generator().manual_seed(0)
    ctx = [0, 0, 700, 0, *torch.randint(1, 4096, (60,), generator=gen).tolist()]
    q_lens = [512, 77, 300, 1] + [1] * 60
    b = make_batch(
        q_lens,
        ctx,
        num_heads=heads,
        rank=rank,
        rope=rope,
        block_size=block_size,
        dtype=torch.bfloat16,
        device="cuda",
    )
    torch.testing.assert_close(
        mla_attention(**b).float(),
        mla_attention_ref(**b).float(),  # type: ignore[arg-type]
        atol=2e-2,
        rtol=2e-2,
    )
    decode_only = make_batch(
        [1] * 256,
        torch.randint(1, 2048, (256,), generator=gen).tolist(),
        num_heads=heads,
        rank=rank,
        rope=rope,
        block_size=block_size,
        dtype=torch.bfloat16,
        device="cuda",
    )
    torch.testing.assert_close(
        mla_attention(**decode_only).float(),  # type: ignore[arg-type]
        mla_attention_ref(**decode_only).float(),
        atol=2e-2,
        rtol=2e-2,
    )  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(GPU_LAYOUTS))
def test_split_decode_bf16_gpu(layout: str) -> None:
    heads, rank, rope = GPU_LAYOUTS[layout]
    gen = torch.Generator().manual_seed(1)
    for num_reqs in (1, 4, 32):  # the split counts the launcher picks for them, and 64
        ctx = torch.randint(1, 8192, (num_reqs,), generator=gen).tolist()
        b = make_batch(
            [1] * num_reqs,
            ctx,
            num_heads=heads,
            rank=rank,
            rope=rope,
            block_size=16,
            dtype=torch.bfloat16,
            device="cuda",
        )
        want = mla_attention_ref(**b).float()  # type: ignore[arg-type]
        for splits in (None, 64):
            torch.testing.assert_close(
                mla_attention(**b, num_kv_splits=splits).float(),
                want,  # type: ignore[arg-type]
                atol=2e-2,
                rtol=2e-2,
            )


@pytest.mark.gpu
def test_kernel_float32_gpu_is_exact_to_rounding() -> None:
    b = make_batch(
        [64, 1, 9],
        [0, 300, 40],
        num_heads=16,
        rank=512,
        rope=64,
        block_size=16,
        dtype=torch.float32,
        device="cuda",
    )
    torch.testing.assert_close(mla_attention(**b), mla_attention_ref(**b), atol=1e-5, rtol=1e-5)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_concat_and_cache_gpu_bf16() -> None:
    kv_c, k_pe, cache, slots = _latent_write_inputs("cuda", torch.bfloat16)
    want = cache.clone()
    concat_and_cache_mla_ref(kv_c, k_pe, want, slots)
    concat_and_cache_mla(kv_c, k_pe, cache, slots)
    assert torch.equal(cache, want)
