"""Mamba-1's causal conv1d: the Triton kernels against their torch references (small shapes:
through TRITON_INTERPRET=1 on CPU, compiled where there is a GPU), the references against HF's
computation (``F.conv1d`` over the whole sequence, transformers' ``causal_conv1d_update``),
chunked prefill against one piece, decode against the varlen kernel, and the `gpu` tests at
Mamba-130m's shape in bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mamba_cases import (
    DEVICE,
    StateBatch,
    chunk_steps,
    randn,
    random_q_lens,
    run_in_steps,
    state_batch,
    whole_step,
)

from turnout.kernels._triton import HAS_TRITON
from turnout.kernels.causal_conv1d import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
DIM = 72  # two channel blocks of the kernel's 64
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def conv_args(
    b: StateBatch,
    *,
    width: int,
    dtype: torch.dtype,
    seed: int,
    bias: bool = True,
    dim: int = DIM,
    device: str = DEVICE,
) -> dict[str, object]:
    """Inputs of one varlen call; the slots hold random (non-zero) states."""
    return dict(
        x=randn(b.num_tokens, dim, seed=seed, dtype=dtype, device=device),
        weight=randn(dim, width, seed=seed + 1, dtype=dtype, scale=0.5, device=device),
        bias=randn(dim, seed=seed + 2, dtype=dtype, device=device) if bias else None,
        conv_state=randn(b.num_slots, dim, width - 1, seed=seed + 3, dtype=dtype, device=device),
        query_start_loc=b.query_start_loc,
        state_indices=b.state_indices,
        has_initial_state=b.has_initial_state,
    )


def run(fn, args: dict[str, object]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Call on a copy of the state; returns (out, the state afterwards)."""
    state = args["conv_state"].clone()  # type: ignore[union-attr]
    return fn(**{**args, "conv_state": state}), state


# seed -> (width, activation, bias): HF Mamba's width 4, the shortest width 2, width 3.
VARIANTS = {0: (4, "silu", True), 1: (2, "silu", False), 2: (3, None, True)}


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", sorted(VARIANTS))
def test_kernel_equals_reference(seed: int, dtype: torch.dtype) -> None:
    width, activation, bias = VARIANTS[seed]
    b = state_batch(random_q_lens(seed, width, max_len=24), seed=seed)
    args = {
        **conv_args(b, width=width, dtype=dtype, seed=seed, bias=bias),
        "activation": activation,
    }
    out, state = run(causal_conv1d, args)
    want_out, want_state = run(causal_conv1d_ref, args)
    torch.testing.assert_close(out, want_out, **TOL[dtype])
    assert torch.equal(state, want_state)  # the state holds inputs: copied, not computed


def _hf_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """HF ``causal_conv1d_fn`` on one whole sequence [L, dim]: ``nn.Conv1d(groups=dim,
    padding=width - 1)`` then ``[..., :L]``, silu."""
    width, length = weight.shape[1], x.shape[0]
    y = F.conv1d(x.T.unsqueeze(0), weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])
    return F.silu(y[0, :, :length]).T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_in_chunks_equals_conv1d_over_the_whole_sequence(seed: int) -> None:
    width = 4
    q_lens = [1, 2, 9, 23]  # shorter than width - 1, and chunked into pieces shorter still
    slots = [5, 0, 3, 1]
    b = state_batch(q_lens, seed=seed, slots=slots, num_slots=6, device="cpu")
    args = conv_args(b, width=width, dtype=torch.float32, seed=seed, device="cpu")
    x, weight, bias, state = args["x"], args["weight"], args["bias"], args["conv_state"]
    out = run_in_steps(
        causal_conv1d_ref,
        {"x": x},
        q_lens,
        slots,
        chunk_steps(q_lens, 3, seed),  # type: ignore[arg-type]
        weight=weight,
        bias=bias,
        conv_state=state,
    )
    for i, span in enumerate(b.spans()):
        torch.testing.assert_close(out[span], _hf_conv(x[span], weight, bias), atol=1e-5, rtol=1e-5)  # type: ignore[index, arg-type]
        xpad = torch.cat([torch.zeros(width - 1, DIM), x[span]])  # type: ignore[index]
        assert torch.equal(state[slots[i]], xpad[-(width - 1) :].T)  # type: ignore[index]


@needs_triton
def test_kernel_in_chunks_equals_one_piece() -> None:
    width, q_lens, slots = 4, [2, 13, 35], [2, 4, 0]
    b = state_batch(q_lens, seed=7, slots=slots, num_slots=5)
    args = conv_args(b, width=width, dtype=torch.float32, seed=7)
    fixed = {"weight": args["weight"], "bias": args["bias"]}
    results = []
    for steps in (whole_step(q_lens), chunk_steps(q_lens, 3, seed=7)):
        state = args["conv_state"].clone()  # type: ignore[union-attr]
        results.append(
            (
                run_in_steps(
                    causal_conv1d,
                    {"x": args["x"]},
                    q_lens,
                    slots,
                    steps,  # type: ignore[dict-item]
                    conv_state=state,
                    **fixed,
                ),
                state,
            )
        )
    (whole, whole_state), (chunked, chunked_state) = results
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(chunked_state, whole_state)


@needs_triton
def test_no_initial_state_ignores_what_the_slot_holds() -> None:
    # A reused slot (a new request, or a recompute after preemption) may hold anything.
    b = state_batch([1, 2, 6], seed=3, init=[False, False, False])
    args = conv_args(b, width=4, dtype=torch.float32, seed=3)
    garbage = torch.full_like(args["conv_state"], float("nan"))  # type: ignore[arg-type]
    out, state = run(causal_conv1d, {**args, "conv_state": garbage})
    want, want_state = run(causal_conv1d_ref, {**args, "conv_state": torch.zeros_like(garbage)})
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    slots = b.state_indices.long()
    assert torch.equal(state[slots], want_state[slots])  # zeros shifted in, no NaN


@needs_triton
@pytest.mark.parametrize("fn", [causal_conv1d, causal_conv1d_ref], ids=["kernel", "ref"])
def test_padding_and_empty_requests_touch_no_state(fn) -> None:  # type: ignore[no-untyped-def]
    # A negative slot is CUDA-graph padding; a request with no tokens this step has nothing
    # to add, even without an initial state (its slot may belong to a running request).
    b = state_batch(
        [3, 0, 2, 4], seed=4, slots=[2, 0, -1, 1], init=[True, False, True, False], num_slots=4
    )
    args = conv_args(b, width=4, dtype=torch.float32, seed=4)
    out, state = run(fn, args)
    before = args["conv_state"]
    assert torch.equal(state[[0, 3]], before[[0, 3]])  # type: ignore[index]
    spans = b.spans()
    real = torch.cat(
        [torch.arange(spans[0].start, spans[0].stop), torch.arange(spans[3].start, spans[3].stop)]
    )
    keep = state_batch([3, 4], seed=0, slots=[2, 1], init=[True, False], num_slots=4)
    want, want_state = run(
        causal_conv1d_ref,
        {
            **args,
            "x": args["x"][real.to(DEVICE)],  # type: ignore[index]
            "query_start_loc": keep.query_start_loc,
            "state_indices": keep.state_indices,
            "has_initial_state": keep.has_initial_state,
        },
    )
    torch.testing.assert_close(out[real.to(DEVICE)], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(state, want_state)


@needs_triton
def test_strided_inputs_and_a_dim_major_state_buffer() -> None:
    # x as the first half of in_proj's output [T, 2 * dim]; the state as a [slots, width - 1,
    # dim] buffer seen as [slots, dim, width - 1] (channels contiguous).
    b = state_batch([5, 1, 3], seed=5)
    args = conv_args(b, width=4, dtype=torch.float32, seed=5)
    xz = torch.cat([args["x"], torch.randn_like(args["x"])], dim=1)  # type: ignore[list-item]
    buffer = args["conv_state"].transpose(1, 2).contiguous()  # type: ignore[union-attr]
    state = buffer.transpose(1, 2)
    out = causal_conv1d(**{**args, "x": xz[:, :DIM], "conv_state": state})
    want, want_state = run(causal_conv1d_ref, args)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(state, want_state)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_update_equals_reference_and_the_varlen_kernel_with_one_token(dtype: torch.dtype) -> None:
    n = 6
    b = state_batch([1] * n, seed=6, init=[True] * n)
    args = conv_args(b, width=4, dtype=dtype, seed=6)
    upd = {k: args[k] for k in ("x", "weight", "bias", "conv_state", "state_indices")}
    out, state = run(causal_conv1d_update, upd)
    want, want_state = run(causal_conv1d_update_ref, upd)
    torch.testing.assert_close(out, want, **TOL[dtype])
    assert torch.equal(state, want_state)
    varlen, varlen_state = run(causal_conv1d, args)
    torch.testing.assert_close(out, varlen, **TOL[dtype])
    assert torch.equal(state, varlen_state)


@needs_triton
def test_update_skips_padding_rows() -> None:
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEVICE)
    x = randn(3, DIM, seed=8)
    weight, state = randn(DIM, 4, seed=9), randn(4, DIM, 3, seed=10)
    for fn in (causal_conv1d_update, causal_conv1d_update_ref):
        after = state.clone()
        out = fn(x, weight, None, after, slots, activation=None)
        assert torch.equal(after[[1, 2]], state[[1, 2]])
        assert torch.equal(after[3], torch.cat([state[3, :, 1:], x[0, :, None]], dim=1))
        torch.testing.assert_close(
            out[0], (torch.cat([state[3], x[0, :, None]], 1) * weight).sum(1)
        )


def test_update_reference_equals_transformers() -> None:
    hf = pytest.importorskip("transformers.models.mamba.modeling_mamba")
    if not hasattr(hf, "causal_conv1d_update"):
        pytest.skip("this transformers has no causal_conv1d_update function")
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    x, weight, bias = (
        randn(3, DIM, seed=11, device="cpu"),
        randn(DIM, 4, seed=12, device="cpu"),
        None,
    )
    state = randn(4, DIM, 3, seed=13, device="cpu")
    hf_state = state[slots.long()].clone()
    want = hf.causal_conv1d_update(x.unsqueeze(2), hf_state, weight, bias, activation="silu")[
        :, :, 0
    ]
    out = causal_conv1d_update_ref(x, weight, bias, state, slots)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(state[slots.long()], hf_state)


def test_bad_arguments_are_named() -> None:
    b = state_batch([2, 1], seed=0, device="cpu")
    args = conv_args(b, width=4, dtype=torch.float32, seed=0, device="cpu")
    bad = {
        "activation must be 'silu' or None, got 'gelu'": {"activation": "gelu"},
        r"conv_state must be \[num_slots, 72, 3\] float32": {"conv_state": torch.zeros(5, DIM, 4)},
        "weight must have width >= 2": {
            "weight": torch.zeros(DIM, 1),
            "conv_state": torch.zeros(5, DIM, 0),
        },
        "query_start_loc must have num_reqs . 1 = 3 entries": {
            "query_start_loc": torch.tensor([0, 2], dtype=torch.int32)
        },
        "has_initial_state must be bool, got int32": {
            "has_initial_state": torch.ones(2, dtype=torch.int32)
        },
        "bias must be .72. float32": {"bias": torch.zeros(DIM, dtype=torch.float16)},
        "x must be float32, float16 or bfloat16": {"x": torch.zeros(3, DIM, dtype=torch.int32)},
    }
    for message, change in bad.items():
        for fn in (causal_conv1d, causal_conv1d_ref):
            with pytest.raises(ValueError, match=message):
                fn(**{**args, **change})


# --- GPU: Mamba-130m's shape in bf16 -------------------------------------------------------


@pytest.mark.gpu
def test_kernels_equal_references_at_mamba_130m_bf16_gpu() -> None:
    gen = torch.Generator().manual_seed(0)
    q_lens = [512, 77, 1, 2, 300, *torch.randint(1, 4, (60,), generator=gen).tolist()]
    b = state_batch(q_lens, seed=0, num_slots=80, device="cuda")
    args = conv_args(b, width=4, dtype=torch.bfloat16, seed=0, dim=1536, device="cuda")
    out, state = run(causal_conv1d, args)
    want, want_state = run(causal_conv1d_ref, args)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(state, want_state)
    n = 256
    upd = state_batch([1] * n, seed=1, num_slots=300, device="cuda")
    u = conv_args(upd, width=4, dtype=torch.bfloat16, seed=1, dim=1536, device="cuda")
    u = {k: u[k] for k in ("x", "weight", "bias", "conv_state", "state_indices")}
    out, state = run(causal_conv1d_update, u)
    want, want_state = run(causal_conv1d_update_ref, u)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(state, want_state)
