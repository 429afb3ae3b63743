"""Split-KV decoding (kernels/paged_attention_split.py) against the torch references, and the
dispatch of the model layer between it and the unified kernel (small shapes through
TRITON_INTERPRET=1 on CPU; the `gpu` tests at real head layouts in bf16)."""

from __future__ import annotations

import pytest
import torch
from test_paged_attention import KERNEL_DEVICE, make_batch, needs_triton

from turnout.engine.model.attention import SPLIT_KV_MAX_PROGRAMS, use_split_kv
from turnout.kernels.paged_attention import AttentionTiles, paged_attention, paged_attention_ref
from turnout.kernels.paged_attention_split import (
    paged_attention_split,
    paged_attention_split_ref,
    split_workspace_numel,
)

TILES = AttentionTiles(block_m=16, block_n=16)
# (ctx_lens) of decode steps, one query each: contexts shorter than a key tile, shorter than the
# segment count (most segments empty), off the tile grid, and a padding request at the end.
DECODE_STEPS = {
    "short": [0, 2, 5],
    "long": [95, 130, 41],
    "padded": [70, 0, 33, -1],  # -1: a padding request (no query, seq_len 0)
}


def _decode_batch(
    ctx: list[int],
    *,
    group: int,
    block_size: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = KERNEL_DEVICE,
) -> tuple[dict[str, object], int]:
    q_lens = [0 if c < 0 else 1 for c in ctx]
    b = make_batch(
        q_lens,
        [max(c, 0) for c in ctx],
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        device=device,
        seed=seed,
    )
    b["max_query_len"] = 1
    return b, sum(q_lens)


@pytest.mark.parametrize("segments", [1, 3, 8])
@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("step", sorted(DECODE_STEPS))
def test_split_reference_equals_reference(step: str, window: int | None, segments: int) -> None:
    b, _ = _decode_batch(DECODE_STEPS[step], group=2, block_size=4, device="cpu")
    torch.testing.assert_close(
        paged_attention_split_ref(**b, sliding_window=window, num_segments=segments),  # type: ignore[arg-type]
        paged_attention_ref(**b, sliding_window=window),
        atol=1e-5,
        rtol=1e-5,
    )  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("segments", [1, 2, 5, 16])
@pytest.mark.parametrize("step", sorted(DECODE_STEPS))
def test_split_kernel_equals_reference(step: str, segments: int) -> None:
    b, num_real = _decode_batch(DECODE_STEPS[step], group=2, block_size=5, seed=segments)
    out = torch.full_like(b["query"], 7.0)  # type: ignore[arg-type]
    paged_attention_split(**b, out=out, num_segments=segments, tiles=TILES)  # type: ignore[arg-type]
    want = paged_attention_ref(**b)  # type: ignore[arg-type]
    torch.testing.assert_close(out[:num_real], want[:num_real], atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("window", [None, 1, 9])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_split_kernel_layouts_and_windows(group: int, block_size: int, window: int | None) -> None:
    b, _ = _decode_batch(DECODE_STEPS["long"], group=group, block_size=block_size, seed=group)
    torch.testing.assert_close(
        paged_attention_split(**b, sliding_window=window, num_segments=4, tiles=TILES),  # type: ignore[arg-type]
        paged_attention_ref(**b, sliding_window=window),
        atol=1e-5,
        rtol=1e-5,
    )  # type: ignore[arg-type]


@needs_triton
def test_split_kernel_short_queries_padding_rows_and_workspace() -> None:
    # Up to BLOCK_Q queries per request (speculative decoding), CUDA-graph padding rows after
    # query_start_loc[-1] untouched, a caller's workspace reused.
    b = make_batch(
        [2, 1, 3],
        [30, 0, 17],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device=KERNEL_DEVICE,
        seed=3,
    )
    q = b["query"]
    assert isinstance(q, torch.Tensor)
    b["query"] = torch.cat([q, torch.randn(2, *q.shape[1:], device=q.device)])
    out = torch.full_like(b["query"], 7.0)  # type: ignore[arg-type]
    ws = torch.empty(split_workspace_numel(8, 4, 16, 6), device=q.device)
    paged_attention_split(**b, out=out, num_segments=6, tiles=TILES, workspace=ws)  # type: ignore[arg-type]
    torch.testing.assert_close(out[:6], paged_attention_ref(**b)[:6], atol=1e-5, rtol=1e-5)  # type: ignore[arg-type]
    assert (out[6:] == 7.0).all()


@needs_triton
def test_split_launcher_refuses_what_it_cannot_serve() -> None:
    b, _ = _decode_batch([3, 4], group=2, block_size=4, device="cpu")
    with pytest.raises(ValueError, match="max_query_len=9 exceeds the 8 queries"):
        paged_attention_split(**{**b, "max_query_len": 9}, tiles=TILES)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workspace must be"):
        paged_attention_split(
            **b,
            tiles=TILES,
            num_segments=2,  # type: ignore[arg-type]
            workspace=torch.empty(10),
        )
    # 0 (falsy) once fell back to the default count instead of being refused as documented
    for bad in (0, 2.0):
        with pytest.raises(ValueError, match="num_segments must be an int >= 1"):
            paged_attention_split(**b, tiles=TILES, num_segments=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="num_segments must be an int >= 1"):
            paged_attention_split_ref(**b, num_segments=bad)  # type: ignore[arg-type]


def test_dispatch_splits_only_small_decode_steps() -> None:
    assert use_split_kv(1, 4, 8) and use_split_kv(1, SPLIT_KV_MAX_PROGRAMS // 8 - 1, 8)
    assert not use_split_kv(1, SPLIT_KV_MAX_PROGRAMS // 8, 8)
    assert not use_split_kv(2, 1, 8)  # a step with a longer query: the unified kernel


@needs_triton
def test_model_layer_dispatch_matches_reference() -> None:
    from turnout.engine.model.attention import paged_attention_forward
    from turnout.engine.model.attention_metadata import AttentionMetadata

    for q_lens, ctx in (([1, 1], [40, 7]), ([3, 1], [10, 7])):
        b = make_batch(
            q_lens,
            ctx,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            block_size=4,
            dtype=torch.float32,
            device=KERNEL_DEVICE,
        )
        kv = b["kv_cache"]
        assert isinstance(kv, torch.Tensor)
        n = sum(q_lens)
        md = AttentionMetadata(
            query_start_loc=b["query_start_loc"],
            seq_lens=b["seq_lens"],  # type: ignore[arg-type]
            block_table=b["block_table"],
            max_query_len=max(q_lens),  # type: ignore[arg-type]
            slot_mapping=torch.full((n,), -1, dtype=torch.int64, device=kv.device),
            max_seq_len=max(c + q for c, q in zip(ctx, q_lens, strict=True)),
            num_actual_tokens=n,
            block_size=4,
            causal=True,
        )
        kv_new = torch.zeros(n, 2, 16, device=kv.device)
        got = paged_attention_forward(
            b["query"],
            kv_new,
            kv_new,
            kv,
            md,
            scale=0.25,  # type: ignore[arg-type]
            backend="triton",
        )
        want = paged_attention_forward(
            b["query"],
            kv_new,
            kv_new,
            kv,
            md,
            scale=0.25,  # type: ignore[arg-type]
            backend="torch",
        )
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --- GPU: realistic shapes in bf16 -------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("segments", [None, 4, 32, 64])
@pytest.mark.parametrize("heads", [(16, 8, 128), (32, 8, 128), (9, 3, 64)])
def test_split_kernel_bf16_gpu(heads: tuple[int, int, int], segments: int | None) -> None:
    num_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(0)
    ctx = [8191, 20, 0, *torch.randint(1, 32768, (5,), generator=gen).tolist()]
    b = make_batch(
        [1] * len(ctx),
        ctx,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
    )
    want = paged_attention_ref(**b).float()  # type: ignore[arg-type]
    torch.testing.assert_close(
        paged_attention_split(**b, num_segments=segments).float(),  # type: ignore[arg-type]
        want,
        atol=2e-2,
        rtol=2e-2,
    )
    torch.testing.assert_close(paged_attention(**b).float(), want, atol=2e-2, rtol=2e-2)  # type: ignore[arg-type]
