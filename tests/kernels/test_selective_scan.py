"""Mamba-1's selective scan: the Triton kernels against their torch references (small shapes:
through TRITON_INTERPRET=1 on CPU, compiled where there is a GPU), the references against HF's
computation (the sequential loop of ``MambaMixer.slow_forward``, and transformers' own
``mamba_selective_scan`` / ``mamba_selective_state_update`` where it has them), chunked prefill
against one piece, decode against the varlen kernel, and the `gpu` tests at Mamba-130m's shape
in bf16."""

from __future__ import annotations

import math

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
from turnout.kernels.selective_scan import (
    ScanBlockConfig,
    selective_scan,
    selective_scan_ref,
    selective_state_update,
    selective_state_update_ref,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
DIM, D_STATE = 40, 5  # two channel blocks of the default 32; d_state not a power of two
TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
STATE_TOL = {"atol": 1e-4, "rtol": 1e-4}  # float32 in both dtypes
PER_TOKEN = ("x", "dt", "B", "C", "z")


def scan_args(
    b: StateBatch,
    *,
    dtype: torch.dtype,
    seed: int,
    optional: bool = True,
    dim: int = DIM,
    d_state: int = D_STATE,
    dt_scale: float = 1.0,
    device: str = DEVICE,
) -> dict[str, object]:
    """Inputs of one varlen call, with HF Mamba's S4D-real A (-1 .. -d_state per channel,
    jittered); the slots hold random states. ``optional=False`` leaves out D, z and dt_bias."""
    g = torch.Generator().manual_seed(seed)
    A = -torch.arange(1, d_state + 1).float().repeat(dim, 1) * (
        0.5 + torch.rand(dim, d_state, generator=g)
    )
    t = b.num_tokens
    return dict(
        x=randn(t, dim, seed=seed, dtype=dtype, device=device),
        dt=randn(t, dim, seed=seed + 1, dtype=dtype, scale=dt_scale, device=device),
        A=A.to(device),
        B=randn(t, d_state, seed=seed + 2, dtype=dtype, device=device),
        C=randn(t, d_state, seed=seed + 3, dtype=dtype, device=device),
        D=randn(dim, seed=seed + 4, device=device) if optional else None,
        z=randn(t, dim, seed=seed + 5, dtype=dtype, device=device) if optional else None,
        dt_bias=randn(dim, seed=seed + 6, scale=0.5, device=device) - 2.0 if optional else None,
        ssm_state=randn(b.num_slots, dim, d_state, seed=seed + 7, device=device),
        query_start_loc=b.query_start_loc,
        state_indices=b.state_indices,
        has_initial_state=b.has_initial_state,
    )


def run(fn, args: dict[str, object]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Call on a copy of the state; returns (out, the state afterwards)."""
    state = args["ssm_state"].clone()  # type: ignore[union-attr]
    return fn(**{**args, "ssm_state": state}), state


def hf_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    z: torch.Tensor,
    dt_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF ``MambaMixer.slow_forward``'s recurrent loop for one whole sequence from a zero state,
    in its order of operations, transposed to [L, dim]: returns (y, the last state)."""
    delta = F.softplus(dt + dt_bias)  # [L, dim]
    discrete_A = torch.exp(A[None, :, :] * delta[:, :, None])  # [L, dim, d_state]
    deltaB_u = delta[:, :, None] * B[:, None, :] * x[:, :, None]
    h = torch.zeros(A.shape)
    ys = []
    for t in range(x.shape[0]):
        h = discrete_A[t] * h + deltaB_u[t]
        ys.append(h @ C[t])
    y = torch.stack(ys) + x * D
    return y * F.silu(z), h


# seed -> (tiles, dt scale, D/z/dt_bias, delta_softplus). Small tiles: several chunks and a
# tail; dt scale 10: softplus near its threshold and of large negative values.
VARIANTS = {
    0: (None, 1.0, True, True),
    1: (ScanBlockConfig(block_d=16, chunk=4, num_warps=2), 10.0, True, True),
    2: (ScanBlockConfig(block_d=64, chunk=2), 0.3, False, False),
}


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", sorted(VARIANTS))
def test_kernel_equals_reference(seed: int, dtype: torch.dtype) -> None:
    config, dt_scale, optional, softplus = VARIANTS[seed]
    b = state_batch(random_q_lens(seed, 4, max_len=14), seed=seed)
    args = {
        **scan_args(b, dtype=dtype, seed=seed, optional=optional, dt_scale=dt_scale),
        "delta_softplus": softplus,
    }
    if not softplus:  # delta used as is: keep it positive, as a softplus would
        args["dt"] = args["dt"].abs()  # type: ignore[union-attr]
    out, state = run(selective_scan, {**args, "block_config": config})
    want, want_state = run(selective_scan_ref, args)
    torch.testing.assert_close(out, want, **TOL[dtype])
    torch.testing.assert_close(state, want_state, **STATE_TOL)


@needs_triton
def test_kernel_softplus_keeps_tiny_deltas() -> None:
    # softplus(dt) = log(1 + exp(dt)) for dt < -17: 1 + exp(dt) rounds to 1 in float32, and a
    # plain log gave delta = 0 (no input at all) where torch's softplus gives exp(dt).
    b = state_batch([4], seed=12, init=[False])
    args = {
        **scan_args(b, dtype=torch.float32, seed=12, optional=False),
        "dt": torch.linspace(-25.0, -17.0, 4 * DIM, device=DEVICE).view(4, DIM),
    }
    out, _ = run(selective_scan, args)
    want, _ = run(selective_scan_ref, args)
    assert want.abs().min() > 0
    torch.testing.assert_close(out, want, atol=0.0, rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_reference_in_chunks_equals_the_hf_loop_over_the_whole_sequence(seed: int) -> None:
    q_lens, slots = [1, 2, 9, 17], [4, 0, 3, 1]
    b = state_batch(q_lens, seed=seed, slots=slots, num_slots=5, device="cpu")
    args = scan_args(b, dtype=torch.float32, seed=seed, device="cpu")
    per_token = {k: args[k] for k in PER_TOKEN}
    fixed = {k: args[k] for k in ("A", "D", "dt_bias", "ssm_state")}
    out = run_in_steps(
        selective_scan_ref, per_token, q_lens, slots, chunk_steps(q_lens, 3, seed), **fixed
    )  # type: ignore[arg-type]
    for i, span in enumerate(b.spans()):
        want, want_h = hf_scan(
            *(args[k][span] for k in ("x", "dt")),
            args["A"],  # type: ignore[index, arg-type]
            *(args[k][span] for k in ("B", "C")),
            args["D"],
            args["z"][span],  # type: ignore[index, arg-type]
            args["dt_bias"],
        )  # type: ignore[arg-type]
        torch.testing.assert_close(out[span], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(args["ssm_state"][slots[i]], want_h, atol=1e-5, rtol=1e-5)  # type: ignore[index]


@needs_triton
def test_kernel_in_chunks_equals_one_piece() -> None:
    q_lens, slots = [3, 9, 14], [1, 3, 0]
    b = state_batch(q_lens, seed=9, slots=slots, num_slots=4)
    args = scan_args(b, dtype=torch.float32, seed=9)
    per_token = {k: args[k] for k in PER_TOKEN}
    fixed = {k: args[k] for k in ("A", "D", "dt_bias")}
    results = []
    for steps in (whole_step(q_lens), chunk_steps(q_lens, 3, seed=9)):
        state = args["ssm_state"].clone()  # type: ignore[union-attr]
        results.append(
            (
                run_in_steps(
                    selective_scan,
                    per_token,
                    q_lens,
                    slots,
                    steps,
                    ssm_state=state,  # type: ignore[arg-type]
                    block_config=ScanBlockConfig(block_d=32, chunk=4),
                    **fixed,
                ),
                state,
            )
        )
    (whole, whole_state), (chunked, chunked_state) = results
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked_state, whole_state, atol=1e-6, rtol=1e-6)


@needs_triton
def test_no_initial_state_ignores_what_the_slot_holds() -> None:
    b = state_batch([1, 4], seed=3, init=[False, False])
    args = scan_args(b, dtype=torch.float32, seed=3)
    garbage = torch.full_like(args["ssm_state"], float("nan"))  # type: ignore[arg-type]
    out, state = run(selective_scan, {**args, "ssm_state": garbage})
    want, want_state = run(selective_scan_ref, {**args, "ssm_state": torch.zeros_like(garbage)})
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    slots = b.state_indices.long()
    torch.testing.assert_close(state[slots], want_state[slots], atol=1e-6, rtol=1e-6)


@needs_triton
@pytest.mark.parametrize("fn", [selective_scan, selective_scan_ref], ids=["kernel", "ref"])
def test_padding_and_empty_requests_touch_no_state(fn) -> None:  # type: ignore[no-untyped-def]
    b = state_batch(
        [3, 0, 2, 4], seed=4, slots=[2, 0, -1, 1], init=[True, False, True, False], num_slots=4
    )
    args = scan_args(b, dtype=torch.float32, seed=4)
    out, state = run(fn, args)
    before = args["ssm_state"]
    assert torch.equal(state[[0, 3]], before[[0, 3]])  # type: ignore[index]
    spans = b.spans()
    real = torch.cat(
        [torch.arange(spans[0].start, spans[0].stop), torch.arange(spans[3].start, spans[3].stop)]
    ).to(DEVICE)
    keep = state_batch([3, 4], seed=0, slots=[2, 1], init=[True, False], num_slots=4)
    want, want_state = run(
        selective_scan_ref,
        {
            **args,
            **{k: args[k][real] for k in PER_TOKEN},  # type: ignore[index]
            "query_start_loc": keep.query_start_loc,
            "state_indices": keep.state_indices,
            "has_initial_state": keep.has_initial_state,
        },
    )
    torch.testing.assert_close(out[real], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, want_state, atol=1e-6, rtol=1e-6)


@needs_triton
def test_strided_views_of_the_projections_and_the_state_buffer() -> None:
    # x and z: halves of in_proj's [T, 2 * dim]; dt, B, C: splits of x_proj's [T, rank + 2N];
    # the state: one layer's view of a [slots, layers, dim, d_state] buffer.
    b = state_batch([6, 1, 3], seed=5)
    args = scan_args(b, dtype=torch.float32, seed=5)
    xz = torch.cat([args["x"], args["z"]], dim=1)  # type: ignore[list-item]
    proj = torch.cat([args["dt"], args["B"], args["C"]], dim=1)  # type: ignore[list-item]
    buffer = torch.zeros(b.num_slots, 2, DIM, D_STATE, device=DEVICE)
    buffer[:, 1] = args["ssm_state"]  # type: ignore[assignment]
    views = {
        "x": xz[:, :DIM],
        "z": xz[:, DIM:],
        "dt": proj[:, :DIM],
        "B": proj[:, DIM : DIM + D_STATE],
        "C": proj[:, DIM + D_STATE :],
        "ssm_state": buffer[:, 1],
    }
    assert not any(v.is_contiguous() for v in views.values())
    out = selective_scan(**{**args, **views})
    want, want_state = run(selective_scan_ref, args)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(buffer[:, 1], want_state, atol=1e-6, rtol=1e-6)
    assert not buffer[:, 0].any()


def _decode_args(
    n: int,
    *,
    dtype: torch.dtype,
    seed: int,
    slots: list[int] | None = None,
    dim: int = DIM,
    d_state: int = D_STATE,
    device: str = DEVICE,
) -> dict[str, object]:
    b = state_batch(
        [1] * n, seed=seed, init=[True] * n, slots=slots, num_slots=n + 3, device=device
    )
    args = scan_args(b, dtype=dtype, seed=seed, dim=dim, d_state=d_state, device=device)
    for key in ("query_start_loc", "has_initial_state"):
        del args[key]
    return args


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_update_equals_reference_and_the_varlen_kernel_with_one_token(dtype: torch.dtype) -> None:
    n = 5
    args = _decode_args(n, dtype=dtype, seed=6)
    out, state = run(selective_state_update, args)
    want, want_state = run(selective_state_update_ref, args)
    torch.testing.assert_close(out, want, **TOL[dtype])
    torch.testing.assert_close(state, want_state, **STATE_TOL)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=DEVICE)
    varlen, varlen_state = run(
        selective_scan,
        {
            **args,
            "query_start_loc": qsl,
            "has_initial_state": torch.ones(n, dtype=torch.bool, device=DEVICE),
        },
    )
    torch.testing.assert_close(out, varlen, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state, varlen_state, atol=1e-6, rtol=1e-6)


@needs_triton
def test_update_skips_padding_rows() -> None:
    args = _decode_args(3, dtype=torch.float32, seed=8, slots=[3, -1, 0])
    for fn in (selective_state_update, selective_state_update_ref):
        out, state = run(fn, args)
        assert torch.equal(state[[1, 2, 4, 5]], args["ssm_state"][[1, 2, 4, 5]])  # type: ignore[index]
        assert not torch.equal(state[3], args["ssm_state"][3])  # type: ignore[index]
        want, _ = run(
            selective_state_update_ref,
            {
                **args,
                "state_indices": args["state_indices"][[0]],  # type: ignore[index]
                **{k: args[k][[0]] for k in PER_TOKEN},
            },
        )  # type: ignore[index]
        torch.testing.assert_close(out[[0]], want, atol=1e-5, rtol=1e-5)


def test_references_equal_transformers_own_functions() -> None:
    hf = pytest.importorskip("transformers.models.mamba.modeling_mamba")
    if not (hasattr(hf, "mamba_selective_scan") and hasattr(hf, "mamba_selective_state_update")):
        pytest.skip("this transformers has no mamba_selective_scan / mamba_selective_state_update")
    b = state_batch([13], seed=10, init=[False], device="cpu")
    a = scan_args(b, dtype=torch.float32, seed=10, device="cpu")
    out, state = run(selective_scan_ref, a)
    bcl = {k: a[k].T.unsqueeze(0) for k in PER_TOKEN}  # type: ignore[union-attr]  # [1, channels, L]
    want, want_h = hf.mamba_selective_scan(
        bcl["x"],
        bcl["dt"],
        a["A"],
        bcl["B"],
        bcl["C"],
        D=a["D"],
        z=bcl["z"],
        delta_bias=a["dt_bias"],
        delta_softplus=True,
        return_last_state=True,
    )
    torch.testing.assert_close(out, want[0].T, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[b.state_indices.long()], want_h, atol=1e-5, rtol=1e-5)
    d = _decode_args(3, dtype=torch.float32, seed=11, device="cpu")
    out, state = run(selective_state_update_ref, d)
    slots = d["state_indices"].long()  # type: ignore[union-attr]
    hf_state = d["ssm_state"][slots].clone()  # type: ignore[index]
    want = hf.mamba_selective_state_update(
        hf_state,
        d["x"],
        d["dt"],
        d["A"],
        d["B"],
        d["C"],
        d["D"],
        dt_bias=d["dt_bias"],
        dt_softplus=True,
        z=d["z"],
    )
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[slots], hf_state, atol=1e-6, rtol=1e-6)


def test_bad_arguments_are_named() -> None:
    b = state_batch([2, 1], seed=0, device="cpu")
    args = scan_args(b, dtype=torch.float32, seed=0, device="cpu")
    bad = {
        r"A must be \[dim, d_state\] float32": {"A": args["A"].half()},  # type: ignore[union-attr]
        r"ssm_state must be \[num_slots, 40, 5\] float32": {
            "ssm_state": torch.zeros(5, DIM, D_STATE).bfloat16()
        },
        r"D must be \[40\] float32": {"D": torch.zeros(DIM - 1)},
        r"B must be \[num_tokens, d_state\] float32": {"B": torch.zeros(3, D_STATE + 1)},
        r"dt must be \[num_tokens, dim\] float32": {"dt": torch.zeros(3, DIM).bfloat16()},
        "has_initial_state must have num_reqs = 2 entries": {
            "has_initial_state": torch.ones(3, dtype=torch.bool)
        },
        "state_indices must be int32, got int64": {"state_indices": torch.tensor([0, 1])},
    }
    for message, change in bad.items():
        for fn in (selective_scan, selective_scan_ref):
            with pytest.raises(ValueError, match=message):
                fn(**{**args, **change})
    with pytest.raises(ValueError, match=r"ScanBlockConfig\.chunk must be a power of two, got 6"):
        ScanBlockConfig(block_d=32, chunk=6)


# --- GPU: Mamba-130m's shape (dim 1536, d_state 16) in bf16 ---------------------------------
@pytest.mark.gpu
def test_kernels_equal_references_at_mamba_130m_bf16_gpu() -> None:
    gen = torch.Generator().manual_seed(0)
    q_lens = [512, 77, 1, 2, 300, *torch.randint(1, 4, (60,), generator=gen).tolist()]
    b = state_batch(q_lens, seed=0, num_slots=80, device="cuda")
    args = scan_args(b, dtype=torch.bfloat16, seed=0, dim=1536, d_state=16, device="cuda")
    args["dt_bias"] = args["dt_bias"] + math.log(math.expm1(0.01)) + 2.0  # type: ignore[operator]  # delta ~ 0.01
    out, state = run(selective_scan, args)
    want, want_state = run(selective_scan_ref, args)
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(state, want_state, atol=1e-3, rtol=1e-3)
    d = _decode_args(256, dtype=torch.bfloat16, seed=1, dim=1536, d_state=16, device="cuda")
    out, state = run(selective_state_update, d)
    want, want_state = run(selective_state_update_ref, d)
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)
