"""Paged attention and the KV-cache write: the torch references against dense attention, the
Triton kernels against the references (small shapes: through TRITON_INTERPRET=1 on CPU, on
the GPU where there is one; the
`gpu` tests on realistic shapes in bf16, incl. Qwen3-0.6B and Llama-3.1-8B head layouts)."""

from __future__ import annotations

import math

import pytest
import torch

from turnout.kernels._triton import HAS_TRITON, INTERPRETED
from turnout.kernels.paged_attention import (
    AttentionTiles,
    paged_attention,
    paged_attention_ref,
    reshape_and_cache,
    reshape_and_cache_ref,
    set_overlapped_launches,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
# Kernel launches need CUDA tensors where a GPU exists (TRITON_INTERPRET is set only without one).
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> dict[str, object]:
    """A packed step: request i has ctx_lens[i] cached tokens and q_lens[i] new ones, its
    blocks scattered over the cache (a random permutation of block ids)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens, strict=True)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(q_lens), max(blocks_per_req) + 2, dtype=torch.int32)
    for i, n in enumerate(blocks_per_req):
        table[i, :n] = torch.tensor([perm.pop() for _ in range(n)])
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    num_tokens = sum(q_lens)
    return dict(
        query=torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(device),
        kv_cache=kv_cache.to(dtype).to(device),
        query_start_loc=torch.tensor(
            [0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
        ),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=table.to(device),
        max_query_len=max(q_lens),
        scale=1.0 / math.sqrt(head_dim),
    )


def dense_attention(b: dict[str, object], window: int | None) -> torch.Tensor:
    """Independent check of the reference: contiguous K/V per request, SDPA with a mask."""
    q_all, kv, qsl, seq_lens, table = (
        b["query"],
        b["kv_cache"],
        b["query_start_loc"],
        b["seq_lens"],
        b["block_table"],
    )
    assert isinstance(q_all, torch.Tensor) and isinstance(kv, torch.Tensor)
    block_size, group = kv.shape[2], q_all.shape[1] // kv.shape[3]
    out = torch.empty_like(q_all)
    for i, seq_len in enumerate(seq_lens.tolist()):  # type: ignore[union-attr]
        s, e = qsl[i].item(), qsl[i + 1].item()  # type: ignore[index]
        slots = [
            table[i, p // block_size].item() * block_size + p % block_size  # type: ignore[index]
            for p in range(seq_len)
        ]
        k = kv[0].flatten(0, 1)[slots].float().repeat_interleave(group, 1).transpose(0, 1)
        v = kv[1].flatten(0, 1)[slots].float().repeat_interleave(group, 1).transpose(0, 1)
        pos_q = torch.arange(seq_len - (e - s), seq_len)[:, None]
        pos_k = torch.arange(seq_len)[None]
        mask = (pos_k <= pos_q) & ((pos_q - pos_k < window) if window else True)
        o = torch.nn.functional.scaled_dot_product_attention(
            q_all[s:e].float().transpose(0, 1),
            k,
            v,
            attn_mask=mask.to(q_all.device),
            scale=b["scale"],
        )  # type: ignore[arg-type]
        out[s:e] = o.transpose(0, 1).to(out.dtype)
    return out


# (q_lens, ctx_lens): prefill, chunked prefill continuation, decodes, all mixed.
SMALL_CASES = {
    "mixed": ([7, 1, 5, 1], [0, 12, 9, 3]),
    "decode-only": ([1, 1, 1], [0, 17, 30]),
    "one-long-prefill": ([37], [0]),
}
LAYOUTS = {  # (num_heads, num_kv_heads, head_dim, block_size)
    "gqa3-d16-b4": (6, 2, 16, 4),
    "mha-d40-b16": (3, 3, 40, 16),  # head_dim not a power of two
    "mqa-d32-b5": (8, 1, 32, 5),  # block_size not a power of two
}


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_reference_equals_dense_attention(case: str, window: int | None) -> None:
    b = make_batch(
        *SMALL_CASES[case],
        num_heads=6,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device="cpu",
    )
    torch.testing.assert_close(
        paged_attention_ref(**b, sliding_window=window),  # type: ignore[arg-type]
        dense_attention(b, window),
        atol=1e-5,
        rtol=1e-5,
    )


@needs_triton
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_kernel_equals_reference_small(case: str, layout: str) -> None:
    heads, kv_heads, head_dim, block_size = LAYOUTS[layout]
    b = make_batch(
        *SMALL_CASES[case],
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    out = torch.full_like(b["query"], float("nan"))  # type: ignore[arg-type]
    paged_attention(**b, out=out)  # type: ignore[arg-type]
    torch.testing.assert_close(out, paged_attention_ref(**b), atol=1e-5, rtol=1e-5)  # type: ignore[arg-type]


@needs_triton
def test_kernel_sliding_window_small() -> None:
    b = make_batch(
        [9, 1],
        [4, 20],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    torch.testing.assert_close(
        paged_attention(**b, sliding_window=5),  # type: ignore[arg-type]
        paged_attention_ref(**b, sliding_window=5),
        atol=1e-5,
        rtol=1e-5,
    )  # type: ignore[arg-type]


@needs_triton
def test_kernel_leaves_padding_rows_alone() -> None:
    # A CUDA-graph batch is padded past query_start_loc[-1]: those rows must stay untouched.
    b = make_batch(
        [3, 1],
        [0, 5],
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    q = b["query"]
    assert isinstance(q, torch.Tensor)
    b["query"] = torch.cat([q, torch.randn(2, *q.shape[1:], device=q.device)])
    out = torch.full_like(b["query"], 7.0)  # type: ignore[arg-type]
    paged_attention(**b, out=out)  # type: ignore[arg-type]
    assert (out[4:] == 7.0).all()
    torch.testing.assert_close(out[:4], paged_attention_ref(**b)[:4])  # type: ignore[arg-type]


# Tiles small enough that tiny batches cross several key tiles: the unmasked middle, the
# diagonal and the window edge all run; two q tiles for the longer prefills.
SMALL_TILES = dict(
    decode_tiles=AttentionTiles(block_m=16, block_n=16),
    prefill_tiles=AttentionTiles(block_m=32, block_n=16),
)
# (q_lens, ctx_lens) of a varlen step: decodes, chunked prefill onto a context, prefills from
# empty, and padding requests (no queries, seq_len 0) at the end, as a CUDA-graph batch has.
VARLEN_STEP = ([1, 9, 1, 23, 2, 1, 0, 0], [40, 13, 0, 0, 30, 5, 0, 0])


def _padded_rows(b: dict[str, object], extra: int) -> None:
    q = b["query"]
    assert isinstance(q, torch.Tensor)
    b["query"] = torch.cat([q, torch.randn(extra, *q.shape[1:], device=q.device)])


@needs_triton
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_kernel_equals_reference_on_a_varlen_step(
    group: int, block_size: int, window: int | None
) -> None:
    b = make_batch(
        *VARLEN_STEP,
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=32,
        block_size=block_size,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
        seed=group + block_size,
    )
    num_real = int(sum(VARLEN_STEP[0]))
    _padded_rows(b, 3)
    out = torch.full_like(b["query"], 7.0)  # type: ignore[arg-type]
    paged_attention(**b, sliding_window=window, out=out, **SMALL_TILES)  # type: ignore[arg-type]
    want = paged_attention_ref(**b, sliding_window=window)  # type: ignore[arg-type]
    torch.testing.assert_close(out[:num_real], want[:num_real], atol=1e-5, rtol=1e-5)
    assert (out[num_real:] == 7.0).all()


@needs_triton
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("extra", [0, 3, 37, 301])  # 301: many padding rows, few programs
@pytest.mark.parametrize("group", [1, 3])
def test_zero_padding_zeroes_the_rows_no_request_owns(group: int, extra: int, split: bool) -> None:
    # With zero_padding, out may come from torch.empty: the launch serving the empty
    # (padding) requests zeroes every row past query_start_loc[num_reqs], for every head,
    # whether the step runs as one launch or two; the other rows are the reference's.
    b = make_batch(
        *VARLEN_STEP,
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=24,
        block_size=5,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
        seed=extra + group,
    )
    num_real = int(sum(VARLEN_STEP[0]))
    _padded_rows(b, extra)
    out = torch.full_like(b["query"], float("nan"))  # type: ignore[arg-type]
    paged_attention(**b, out=out, zero_padding=True, split_short_queries=split, **SMALL_TILES)  # type: ignore[arg-type]
    torch.testing.assert_close(
        out[:num_real], paged_attention_ref(**b)[:num_real], atol=1e-5, rtol=1e-5
    )  # type: ignore[arg-type]
    assert (out[num_real:] == 0).all()


@needs_triton
def test_zero_padding_of_a_step_of_decodes_and_of_an_empty_step() -> None:
    b = make_batch(
        [1, 1, 0],
        [9, 30, 0],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
    )
    _padded_rows(b, 5)
    out = torch.full_like(b["query"], float("nan"))  # type: ignore[arg-type]
    paged_attention(**b, out=out, zero_padding=True)  # type: ignore[arg-type]
    torch.testing.assert_close(out[:2], paged_attention_ref(**b)[:2])  # type: ignore[arg-type]
    assert (out[2:] == 0).all()
    b["max_query_len"] = 0  # a step of padding only: nothing to attend, every row is padding
    out.fill_(float("nan"))
    paged_attention(**b, out=out, zero_padding=True)  # type: ignore[arg-type]
    assert (out == 0).all()


@needs_triton
@pytest.mark.parametrize("tiles", ["small", "default"])
def test_larger_max_query_len_and_one_launch_give_the_same_output(tiles: str) -> None:
    # A CUDA graph captured for a longer max_query_len replays shorter steps; a step may also
    # run all requests on prefill tiles (split_short_queries=False).
    b = make_batch(
        *VARLEN_STEP,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
        seed=5,
    )
    opts = SMALL_TILES if tiles == "small" else {}
    want = paged_attention_ref(**b, sliding_window=6)  # type: ignore[arg-type]
    for max_query_len in (23, 24, 64, 300):
        for split in (True, False):
            got = paged_attention(
                **{**b, "max_query_len": max_query_len},
                sliding_window=6,  # type: ignore[arg-type]
                split_short_queries=split,
                **opts,
            )
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("q_len", [1, 2, 8, 9, 16, 17, 33])
def test_one_request_at_each_tile_boundary(q_len: int) -> None:
    # Query counts at and around BLOCK_Q of both tile kinds, contexts off the key-tile grid.
    b = make_batch(
        [q_len, 1],
        [21, 0],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=16,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
        seed=q_len,
    )
    for window in (None, 1, 20):
        torch.testing.assert_close(
            paged_attention(**b, sliding_window=window, **SMALL_TILES),  # type: ignore[arg-type]
            paged_attention_ref(**b, sliding_window=window),
            atol=1e-5,
            rtol=1e-5,
        )  # type: ignore[arg-type]


@needs_triton
def test_16_bit_kernel_equals_reference() -> None:
    # Triton's interpreter misreads bfloat16 tensors (numpy has no bfloat16): float16 there.
    for dtype in (torch.float16,) if INTERPRETED else (torch.float16, torch.bfloat16):
        b = make_batch(
            *VARLEN_STEP,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            block_size=4,
            dtype=dtype,
            device=KERNEL_DEVICE,
            seed=2,
        )
        torch.testing.assert_close(
            paged_attention(**b, **SMALL_TILES).float(),  # type: ignore[arg-type]
            paged_attention_ref(**b).float(),
            atol=2e-2,
            rtol=2e-2,
        )  # type: ignore[arg-type]


def _cache_write_inputs(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(9, 3 * 2 * 40, generator=gen).to(dtype).to(device)
    key, value = qkv[:, :80].view(9, 2, 40), qkv[:, 80:160].view(9, 2, 40)  # strided views
    slots = torch.tensor([0, 5, -1, 7, 100, 3, -1, 9, 11], dtype=torch.int64, device=device)
    return key, value, torch.zeros(2, 26, 4, 2, 40, dtype=dtype, device=device), slots


def test_reshape_and_cache_ref_writes_slots_and_skips_padding() -> None:
    key, value, cache, slots = _cache_write_inputs("cpu", torch.float32)
    reshape_and_cache_ref(key, value, cache, slots)
    assert torch.equal(cache[0, 100 // 4, 100 % 4], key[4])
    assert torch.equal(cache[1, 1, 3], value[3])  # slot 7
    assert int((cache[0].flatten(0, 1).abs().sum((1, 2)) > 0).sum()) == 7  # two -1 skipped


@needs_triton
def test_reshape_and_cache_kernel_equals_reference() -> None:
    key, value, cache, slots = _cache_write_inputs(KERNEL_DEVICE, torch.float32)
    want = cache.clone()
    reshape_and_cache_ref(key, value, want, slots)
    reshape_and_cache(key, value, cache, slots)
    assert torch.equal(cache, want)


def test_bad_arguments_are_named() -> None:
    b = make_batch(
        [2],
        [0],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device="cpu",
    )
    with pytest.raises(ValueError, match="seq_lens must be int32"):
        paged_attention_ref(**{**b, "seq_lens": b["seq_lens"].long()})  # type: ignore[arg-type, union-attr]
    with pytest.raises(ValueError, match="dtype"):
        paged_attention_ref(**{**b, "query": b["query"].half()})  # type: ignore[arg-type, union-attr]
    key, value, cache, slots = _cache_write_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        reshape_and_cache_ref(key, value, cache, slots.int())


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"block_m": 16, "block_n": 0}, "block_n"),  # launched: every key tile empty, wrong output
        ({"block_m": 16, "block_n": 48}, "block_n"),  # a Triton compile error naming no argument
        ({"block_m": 24, "block_n": 16}, "block_m"),
        ({"block_m": 16, "block_n": 16, "num_warps": 3}, "num_warps"),
        ({"block_m": 16, "block_n": 16, "num_stages": 0}, "num_stages"),
    ],
)
def test_bad_tiles_are_named(fields: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=f"AttentionTiles.{name} must be"):
        AttentionTiles(**fields)


# --- GPU: realistic shapes in bf16 -------------------------------------------------------
GPU_LAYOUTS = {  # (num_heads, num_kv_heads, head_dim): real configs
    "qwen3-0.6b": (16, 8, 128),
    "llama-3.1-8b": (32, 8, 128),
    "smollm2-135m": (9, 3, 64),
}


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("layout", sorted(GPU_LAYOUTS))
def test_kernel_equals_reference_bf16_gpu(layout: str, block_size: int) -> None:
    heads, kv_heads, head_dim = GPU_LAYOUTS[layout]
    # 4 prefills (one chunked onto 700 cached tokens) and 60 decodes with contexts to 4k.
    gen = torch.Generator().manual_seed(0)
    ctx = [0, 0, 700, 0, *torch.randint(1, 4096, (60,), generator=gen).tolist()]
    q_lens = [512, 77, 300, 1] + [1] * 60
    b = make_batch(
        q_lens,
        ctx,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.bfloat16,
        device="cuda",
    )
    got = paged_attention(**b)  # type: ignore[arg-type]
    want = paged_attention_ref(**b)  # type: ignore[arg-type]
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    decode_only = make_batch(
        [1] * 256,
        torch.randint(1, 2048, (256,), generator=gen).tolist(),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.bfloat16,
        device="cuda",
    )
    torch.testing.assert_close(
        paged_attention(**decode_only).float(),  # type: ignore[arg-type]
        paged_attention_ref(**decode_only).float(),
        atol=2e-2,
        rtol=2e-2,
    )  # type: ignore[arg-type]


@pytest.mark.gpu
def test_kernel_float32_gpu_is_exact_to_rounding() -> None:
    b = make_batch(
        [64, 1, 9],
        [0, 300, 40],
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.float32,
        device="cuda",
    )
    torch.testing.assert_close(
        paged_attention(**b),
        paged_attention_ref(**b),  # type: ignore[arg-type]
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.gpu
def test_reshape_and_cache_gpu_bf16() -> None:
    key, value, cache, slots = _cache_write_inputs("cuda", torch.bfloat16)
    want = cache.clone()
    reshape_and_cache_ref(key, value, want, slots)
    reshape_and_cache(key, value, cache, slots)
    assert torch.equal(cache, want)


@pytest.mark.gpu
@pytest.mark.parametrize("prefill", [(8, 512), (2, 4096)])
def test_prefill_from_empty_bf16_gpu(prefill: tuple[int, int]) -> None:
    num_reqs, q_len = prefill
    b = make_batch(
        [q_len] * num_reqs,
        [0] * num_reqs,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
    )
    torch.testing.assert_close(
        paged_attention(**b).float(),
        paged_attention_ref(**b).float(),  # type: ignore[arg-type]
        atol=2e-2,
        rtol=2e-2,
    )


@pytest.mark.gpu
def test_graph_of_a_padded_mixed_step_replays_other_lengths_gpu() -> None:
    # Captured once for 8 request slots and 640 token rows (max_query_len 300), replayed for two
    # steps of different splits, each padded with empty requests (seq_len 0) and rows.
    num_slots, num_rows, width = 8, 640, 64
    steps = [([300, 1, 1, 77, 1], [0, 500, 20, 130, 999]), ([1] * 6 + [250], [7] * 6 + [40])]
    kv = torch.randn(2, num_slots * width, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    qsl = torch.zeros(num_slots + 1, dtype=torch.int32, device="cuda")
    seq_lens = torch.zeros(num_slots, dtype=torch.int32, device="cuda")
    table = torch.randperm(num_slots * width, device="cuda").view(num_slots, width).int()
    query = torch.randn(num_rows, 16, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros_like(query)
    args = (query, kv, qsl, seq_lens, table, 300, 128**-0.5)
    paged_attention(*args, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(*args, out=out)
    for q_lens, ctx in steps:
        n = len(q_lens)
        cum = torch.tensor([0, *q_lens]).cumsum(0)
        qsl.copy_(torch.cat([cum, cum[-1].repeat(num_slots - n)]).int())
        seq_lens.copy_(
            torch.tensor(
                [c + q for c, q in zip(ctx, q_lens, strict=True)] + [0] * (num_slots - n),
                dtype=torch.int32,
            )
        )
        out.fill_(7.0)
        graph.replay()
        num_real = int(cum[-1])
        want = paged_attention_ref(*args)
        torch.testing.assert_close(
            out[:num_real].float(), want[:num_real].float(), atol=2e-2, rtol=2e-2
        )
        assert (out[num_real:] == 7.0).all()


@pytest.mark.gpu
def test_overlapped_halves_give_the_bits_of_serial_launches_gpu() -> None:
    # A mixed step (decodes beside prompt chunks) runs as two launches; on CUDA they overlap on
    # a side stream. Each program writes its own rows, so the bits must not change.
    q_lens = [1] * 24 + [300, 77, 2, 513]
    ctx = [
        int(c)
        for c in torch.randint(0, 900, (len(q_lens),), generator=torch.Generator().manual_seed(3))
    ]
    b = make_batch(
        q_lens,
        ctx,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
    )
    previous = set_overlapped_launches(False)
    try:
        serial = paged_attention(**b)  # type: ignore[arg-type]
        set_overlapped_launches(True)
        overlapped = paged_attention(**b)  # type: ignore[arg-type]
        torch.cuda.synchronize()
    finally:
        set_overlapped_launches(previous)
    assert torch.equal(serial, overlapped)
    torch.testing.assert_close(
        overlapped.float(),
        paged_attention_ref(**b).float(),  # type: ignore[arg-type]
        atol=2e-2,
        rtol=2e-2,
    )


def test_set_overlapped_launches_returns_the_previous_setting() -> None:
    assert set_overlapped_launches(False) is True
    try:
        assert set_overlapped_launches(True) is False
    finally:
        set_overlapped_launches(True)
