"""The fused MoE kernels against their torch references (small shapes: through TRITON_INTERPRET=1
on CPU, compiled where there is a GPU), the references against plain computations, and the
`gpu` tests at Qwen3-30B-A3B / Qwen1.5-MoE-A2.7B expert shapes in bf16, in a CUDA graph and
with CUDA's sync debug mode on."""

from __future__ import annotations

import pytest
import torch

from turnout.kernels._triton import HAS_TRITON
from turnout.kernels.fused_moe import (
    MoEBlockConfig,
    fused_experts,
    fused_experts_ref,
    max_num_tokens_padded,
    moe_align_block_size,
    moe_align_block_size_ref,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def routing(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    *,
    seed: int = 0,
    unused: tuple[int, ...] = (),
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random softmax top-k routing; experts in ``unused`` are never chosen."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    logits[:, list(unused)] = float("-inf")
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return weights.contiguous().to(device), ids.to(torch.int32).to(device)


def experts(
    num_experts: int,
    hidden: int,
    inter: int,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 1,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5
    return w13.to(dtype).to(device), w2.to(dtype).to(device)


def tokens(
    num_tokens: int,
    hidden: int,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 2,
    device: str = "cpu",
) -> torch.Tensor:
    return (
        torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(seed))
        .to(dtype)
        .to(device)
    )


# ---- alignment ----------------------------------------------------------------------------


def _check_alignment(
    topk_ids: torch.Tensor,
    block_m: int,
    num_experts: int,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """The contract, checked from first principles (python lists, no torch ops)."""
    sorted_ids, expert_ids, num_post = (t.cpu().tolist() for t in out)
    flat = topk_ids.flatten().cpu().tolist()
    sentinel, total = len(flat), num_post[0]
    counts = [flat.count(e) for e in range(num_experts)]
    assert total == sum(-(-c // block_m) * block_m for c in counts)
    assert len(sorted_ids) == max_num_tokens_padded(len(flat), num_experts, block_m) >= total
    seen = []
    for b in range(len(expert_ids)):
        if b * block_m >= total:
            assert expert_ids[b] == -1
            continue
        e = expert_ids[b]
        run = sorted_ids[b * block_m : (b + 1) * block_m]
        real = [i for i in run if i != sentinel]
        assert all(flat[i] == e for i in real), f"block {b} of expert {e} holds {real}"
        seen += real
    assert sorted(seen) == list(range(len(flat)))  # every assignment exactly once
    assert expert_ids[: -(-total // block_m)] == sorted(expert_ids[: -(-total // block_m)])


ALIGN_CASES = {  # (num_tokens, num_experts, top_k, block_m, unused experts)
    "decode-one-token": (1, 128, 8, 16, ()),
    "fewer-tokens-than-experts": (3, 16, 2, 16, ()),
    "an-expert-without-tokens": (40, 8, 2, 16, (3,)),
    "top-1": (25, 4, 1, 32, ()),
    "many-chunks": (700, 60, 4, 64, (0, 59)),
}


@pytest.mark.parametrize("case", sorted(ALIGN_CASES))
def test_alignment_reference_meets_the_contract(case: str) -> None:
    t, e, k, bm, unused = ALIGN_CASES[case]
    _, ids = routing(t, e, k, unused=unused)
    _check_alignment(ids, bm, e, moe_align_block_size_ref(ids, bm, e))


@needs_triton
@pytest.mark.parametrize("case", sorted(ALIGN_CASES))
def test_alignment_kernel_equals_reference(case: str) -> None:
    t, e, k, bm, unused = ALIGN_CASES[case]
    _, ids = routing(t, e, k, unused=unused, device=KERNEL_DEVICE)
    got = moe_align_block_size(ids, bm, e)
    _check_alignment(ids, bm, e, got)
    want = moe_align_block_size_ref(ids, bm, e)
    total = int(want[2])
    assert int(got[2]) == total and torch.equal(got[1], want[1])
    # Inside an expert's run the order follows the device's atomics, so a run longer than one
    # block splits its assignments over its blocks in any way: compare each run as a set.
    assert _runs(got, bm, total) == _runs(want, bm, total)


def _runs(aligned: tuple[torch.Tensor, ...], block_m: int, total: int) -> dict[int, list[int]]:
    """Each expert's slots (assignments and sentinels), sorted."""
    sorted_ids, expert_ids = aligned[0].tolist(), aligned[1].tolist()
    runs: dict[int, list[int]] = {}
    for b in range(total // block_m):
        runs.setdefault(expert_ids[b], []).extend(sorted_ids[b * block_m : (b + 1) * block_m])
    return {e: sorted(slots) for e, slots in runs.items()}


def test_alignment_refuses_bad_arguments() -> None:
    _, ids = routing(4, 8, 2)
    with pytest.raises(ValueError, match="int32"):
        moe_align_block_size_ref(ids.long(), 16, 8)
    with pytest.raises(ValueError, match="power of two"):
        moe_align_block_size_ref(ids, 24, 8)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\)"):
        moe_align_block_size_ref(ids, 16, 4)


# ---- fused experts -------------------------------------------------------------------------


def dense_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """Every expert on every token (float64), then the chosen ones weighted: independent of
    the reference's gather-by-expert."""
    x, inter = hidden.double(), w13.shape[1] // 2
    gate_up = torch.einsum("th,eih->tei", x, w13.double())
    act = torch.nn.functional.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    out = torch.einsum("tei,ehi->teh", act, w2.double())  # [T, E, H]
    chosen = out.gather(1, ids.long()[:, :, None].expand(-1, -1, out.shape[2]))
    return (chosen * weights.double()[:, :, None]).sum(1)


def test_reference_equals_a_dense_computation() -> None:
    w13, w2 = experts(6, 40, 24)
    x = tokens(9, 40)
    weights, ids = routing(9, 6, 3, unused=(2,))
    torch.testing.assert_close(
        fused_experts_ref(x, w13, w2, weights, ids),
        dense_moe(x, w13, w2, weights, ids).float(),
        atol=1e-5,
        rtol=1e-5,
    )


SMALL = MoEBlockConfig(block_m=16, block_n=16, block_k=16, group_m=2)
EXPERT_CASES = {  # (T, E, k, H, I, unused, block config)
    "one-token": (1, 8, 2, 32, 16, (), None),
    "fewer-tokens-than-experts": (5, 16, 4, 48, 40, (), None),
    "expert-without-tokens": (33, 6, 2, 64, 32, (1, 4), None),
    "k-and-n-tails-grouped": (20, 4, 3, 40, 24, (), SMALL),  # 40 = 2.5 K-blocks, 24 = 1.5 N-blocks
    "top-1-wide-blocks": (18, 3, 1, 32, 48, (), MoEBlockConfig(32, 32, 32)),
}


@needs_triton
@pytest.mark.parametrize("case", sorted(EXPERT_CASES))
def test_fused_experts_equal_reference(case: str) -> None:
    t, e, k, h, i, unused, cfg = EXPERT_CASES[case]
    w13, w2 = experts(e, h, i, device=KERNEL_DEVICE)
    x = tokens(t, h, device=KERNEL_DEVICE)
    weights, ids = routing(t, e, k, unused=unused, device=KERNEL_DEVICE)
    got = fused_experts(x, w13, w2, weights, ids, block_config=cfg)
    want = fused_experts_ref(x, w13, w2, weights, ids)
    assert got.shape == (t, h) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [fused_experts, fused_experts_ref], ids=["kernel", "reference"])
def test_fused_experts_of_no_tokens(fn) -> None:  # type: ignore[no-untyped-def]
    if fn is fused_experts and not HAS_TRITON:
        pytest.skip("triton not installed")
    w13, w2 = experts(4, 32, 16, device=KERNEL_DEVICE)
    weights, ids = routing(0, 4, 2, device=KERNEL_DEVICE)
    out = fn(tokens(0, 32, device=KERNEL_DEVICE), w13, w2, weights, ids)
    assert out.shape == (0, 32)


@pytest.mark.parametrize("fn", [fused_experts, fused_experts_ref], ids=["kernel", "reference"])
def test_bad_arguments_are_refused_before_any_launch(fn) -> None:  # type: ignore[no-untyped-def]
    w13, w2 = experts(4, 32, 16)
    x = tokens(3, 32)
    weights, ids = routing(3, 4, 2)
    bad = {
        "hidden must be": (x.t(), w13, w2, weights, ids),
        r"w13 must be \[E, 2 \* I, H=32\]": (x, w13[:, :, :16], w2, weights, ids),
        r"w2 must be \[E=4, H=32, I=16\]": (x, w13, w2[:, :, :8], weights, ids),
        "w13 must be float32": (x, w13.double(), w2, weights, ids),
        "topk_ids must be a contiguous": (x, w13, w2, weights, ids.long()),
        "topk_weights must be a contiguous": (x, w13, w2, weights.to(torch.bfloat16), ids),
        r"top_k must be in \[1, E=4\]": (
            x,
            w13,
            w2,
            torch.ones(3, 5),
            torch.zeros(3, 5, dtype=torch.int32),
        ),
    }
    for message, args in bad.items():
        with pytest.raises(ValueError, match=message):
            fn(*args)


# ---- GPU: real expert shapes in bf16 ------------------------------------------------------

REAL_SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "qwen1.5-moe-a2.7b": (60, 4, 2048, 1408)}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(REAL_SHAPES))
@pytest.mark.parametrize("num_tokens", [1, 16, 256, 4096])
def test_bf16_kernel_equals_reference_at_real_shapes(shape: str, num_tokens: int) -> None:
    e, k, h, i = REAL_SHAPES[shape]
    w13, w2 = experts(e, h, i, dtype=torch.bfloat16, device="cuda")
    x = tokens(num_tokens, h, dtype=torch.bfloat16, device="cuda")
    weights, ids = routing(num_tokens, e, k, device="cuda")
    got = fused_experts(x, w13, w2, weights, ids).float()
    want = fused_experts_ref(x, w13, w2, weights, ids).float()
    # Both round the intermediate and the weighted rows to bf16; they differ by the GEMMs'
    # summation order, which can flip an intermediate's bf16 rounding.
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1).min().item()
    assert cos > 0.9999, cos
    torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
def test_fused_experts_replay_from_a_cuda_graph_without_syncs() -> None:
    e, k, h, i = REAL_SHAPES["qwen3-30b-a3b"]
    w13, w2 = experts(e, h, i, dtype=torch.bfloat16, device="cuda")
    x = tokens(8, h, dtype=torch.bfloat16, device="cuda")
    weights, ids = routing(8, e, k, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile outside the capture
        fused_experts(x, w13, w2, weights, ids)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = fused_experts(x, w13, w2, weights, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fused_experts(x, w13, w2, weights, ids)
    new_w, new_ids = routing(8, e, k, seed=5, device="cuda")
    weights.copy_(new_w)
    ids.copy_(new_ids)  # new routing in the same buffers: the replay must follow it
    graph.replay()
    torch.testing.assert_close(static, fused_experts(x, w13, w2, weights, ids), atol=0, rtol=0)
    assert not torch.equal(static, eager)
