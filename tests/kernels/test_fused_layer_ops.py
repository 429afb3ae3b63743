"""The fused decoder-layer kernels (RMSNorm with the residual add, SiLU·mul) against their torch
references and against HF transformers' own modules (``LlamaRMSNorm``, the gated MLP's
activation), on the shapes of a decoder step: hidden rows, Qwen3's per-head q/k rows read in
place from the fused QKV output, odd widths that need masking, bf16 and fp32."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from turnout.kernels._triton import INTERPRETED
from turnout.kernels.rms_norm import rms_norm, rms_norm_ref
from turnout.kernels.silu_mul import silu_and_mul, silu_and_mul_ref

DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(dtype).to(DEVICE)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # bf16: one unit in the last place of values up to ~8; fp32: reduction-order rounding.
    return (
        {"atol": 0.07, "rtol": 0.016} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 100])
def test_rms_norm_matches_hf_llama_rms_norm(dtype: torch.dtype, hidden: int) -> None:
    transformers = pytest.importorskip("transformers")
    x = _randn(7, hidden, dtype=dtype, seed=hidden)
    hf = transformers.models.llama.modeling_llama.LlamaRMSNorm(hidden, eps=1e-6).to(DEVICE, dtype)
    with torch.no_grad():
        hf.weight.copy_(_randn(hidden, dtype=dtype, seed=1))
        want = hf(x)
    got = rms_norm(x, hf.weight.detach(), 1e-6)
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(rms_norm_ref(x, hf.weight.detach(), 1e-6), want, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_add_is_rounded_written_back_and_normalised(dtype: torch.dtype) -> None:
    x, residual = _randn(5, 48, dtype=dtype, seed=2), _randn(5, 48, dtype=dtype, seed=3)
    weight = _randn(48, dtype=dtype, seed=4)
    residual_ref = residual.clone()
    want = rms_norm_ref(x, weight, 1e-5, residual=residual_ref)
    got = rms_norm(x, weight, 1e-5, residual=residual)
    # The sum is one rounding of x + residual in the model dtype: exact when compiled (Triton
    # rounds to nearest even, as torch); the interpreter truncates bf16 casts, one ulp off.
    exact = (
        {"atol": 0, "rtol": 0}
        if not INTERPRETED or dtype == torch.float32
        else {"atol": 0.0625, "rtol": 2**-7}
    )
    torch.testing.assert_close(residual, residual_ref, **exact)
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_head_norm_reads_the_qkv_output_in_place(dtype: torch.dtype) -> None:
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    qkv = _randn(6, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, seed=5)
    q = qkv[:, : num_heads * head_dim].view(6, num_heads, head_dim)  # strided rows, not a copy
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        6, num_kv_heads, head_dim
    )
    weight = _randn(head_dim, dtype=dtype, seed=6)
    before = qkv.clone()
    for part in (q, k):
        torch.testing.assert_close(
            rms_norm(part, weight, 1e-6), rms_norm_ref(part, weight, 1e-6), **_tol(dtype)
        )
    torch.testing.assert_close(qkv, before, atol=0, rtol=0)  # the input is only read


def test_empty_batch_and_bad_arguments_are_named() -> None:
    w = torch.ones(16, device=DEVICE)
    assert rms_norm(torch.empty(0, 16, device=DEVICE), w, 1e-6).shape == (0, 16)
    with pytest.raises(ValueError, match=r"weight must be \[16\] float32, got \[8\] float32"):
        rms_norm(torch.ones(2, 16, device=DEVICE), torch.ones(8, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="unit stride on its last dimension"):
        rms_norm(torch.ones(16, 2, device=DEVICE).t(), w, 1e-6)
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm(
            torch.ones(2, 16, device=DEVICE), w, 1e-6, residual=torch.ones(3, 16, device=DEVICE)
        )
    with pytest.raises(ValueError, match=r"gate_up must be \[num_tokens, 2 \* intermediate\]"):
        silu_and_mul(torch.ones(2, 7, device=DEVICE))
    with pytest.raises(ValueError, match="must be a float tensor, got int32"):
        silu_and_mul(torch.ones(2, 8, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("intermediate", [64, 1500])
def test_silu_and_mul_matches_the_hf_gated_mlp_activation(
    dtype: torch.dtype, intermediate: int
) -> None:
    gate_up = _randn(9, 2 * intermediate, dtype=dtype, seed=intermediate)
    gate, up = gate_up.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up  # LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    got = silu_and_mul(gate_up)
    assert got.shape == (9, intermediate) and got.is_contiguous()
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(silu_and_mul_ref(gate_up), want, atol=0, rtol=0)
    assert silu_and_mul(gate_up[:0]).shape == (0, intermediate)


def _rotary_case(
    dtype: torch.dtype,
    num_tokens: int = 6,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    seed: int = 7,
):
    from turnout.engine.model.config import ModelConfig
    from turnout.engine.model.layers import RotaryEmbedding

    config = ModelConfig.from_hf_dict(
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": 64,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
        }
    )
    rotary = RotaryEmbedding(config).to(DEVICE)
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, seed=seed)
    positions = torch.tensor(
        [0, 1, 7, 100, 300, 511][:num_tokens], dtype=torch.int64, device=DEVICE
    )
    return rotary, qkv, positions


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope_equals_the_model_layers_path(dtype: torch.dtype, with_norm: bool) -> None:
    from turnout.engine.model.layers import RMSNorm, set_fused_layer_ops
    from turnout.kernels.rotary import qk_norm_rope, qk_norm_rope_ref

    rotary, qkv, positions = _rotary_case(dtype)
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    norm_q, norm_k = (
        RMSNorm(head_dim, 1e-6).to(DEVICE, dtype),
        RMSNorm(head_dim, 1e-6).to(DEVICE, dtype),
    )
    with torch.no_grad():
        norm_q.weight.copy_(_randn(head_dim, dtype=dtype, seed=8))
        norm_k.weight.copy_(_randn(head_dim, dtype=dtype, seed=9))
    # The model's unfused path: views of the QKV output, norms, then RotaryEmbedding.
    q = qkv[:, : num_heads * head_dim].view(6, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        6, num_kv_heads, head_dim
    )
    previous = set_fused_layer_ops(False)  # on CUDA the norm module would run the kernel too
    try:
        if with_norm:
            q, k = norm_q(q), norm_k(k)
        want_q, want_k = rotary(positions, q, k)
    finally:
        set_fused_layer_ops(previous)
    weights = (norm_q.weight, norm_k.weight) if with_norm else (None, None)
    got, ref = qkv.clone(), qkv.clone()
    qk_norm_rope(
        got, positions, rotary.cos_cache, rotary.sin_cache, num_heads, num_kv_heads, *weights
    )
    qk_norm_rope_ref(
        ref, positions, rotary.cos_cache, rotary.sin_cache, num_heads, num_kv_heads, *weights
    )
    split = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    # The kernel rounds where torch rounds; compiled, a multiply and the add after it may
    # contract into one FMA (one rounding fewer), and the norm's reduction order differs. The
    # interpreter truncates each of the five bf16 roundings of a rotated value, which a
    # subtraction can magnify to a few ulps.
    tol = (
        {"atol": 0, "rtol": 0}
        if INTERPRETED and dtype == torch.float32 and not with_norm
        else _tol(dtype)
    )
    if INTERPRETED and dtype == torch.bfloat16:
        tol = {"atol": 0.25, "rtol": 0.03}
    for out, exact in ((ref, {"atol": 0, "rtol": 0}), (got, tol)):
        oq, ok, ov = out.split(split, dim=-1)
        torch.testing.assert_close(oq.reshape(want_q.shape), want_q, **exact)
        torch.testing.assert_close(ok.reshape(want_k.shape), want_k, **exact)
        torch.testing.assert_close(ov, qkv.split(split, dim=-1)[2], atol=0, rtol=0)  # v untouched


def test_qk_norm_rope_names_bad_arguments() -> None:
    from turnout.kernels.rotary import qk_norm_rope

    rotary, qkv, positions = _rotary_case(torch.float32)
    args = (rotary.cos_cache, rotary.sin_cache)
    with pytest.raises(ValueError, match="qkv width 256 must be"):
        qk_norm_rope(qkv, positions, *args, 4, 3)
    with pytest.raises(ValueError, match="positions must be int64"):
        qk_norm_rope(qkv, positions.int(), *args, 4, 2)
    with pytest.raises(ValueError, match="give both q_weight and k_weight"):
        qk_norm_rope(qkv, positions, *args, 4, 2, q_weight=torch.ones(32, device=DEVICE))
    with pytest.raises(ValueError, match="one entry per token"):
        qk_norm_rope(qkv, positions[:3], *args, 4, 2)
    # Head counts whose width matches by accident ((-4 + 2 * 6) * 32 = 256) once launched the
    # kernel over a negative head count, leaving q and k unrotated without a word.
    for heads, kv_heads in ((-4, 6), (8, 0)):
        with pytest.raises(ValueError, match="num_heads and num_kv_heads must be ints >= 1"):
            qk_norm_rope(qkv, positions, *args, heads, kv_heads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (6, 3)])
def test_qk_norm_rope_writes_k_and_v_to_their_slots(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int
) -> None:
    # The fused KV write: each token's rotated k and its v land where reshape_and_cache puts
    # them; a slot of -1 (padding) writes nothing; q, k and v in qkv are as without the write.
    from turnout.kernels.paged_attention import reshape_and_cache_ref
    from turnout.kernels.rotary import qk_norm_rope, qk_norm_rope_ref

    head_dim = 32
    rotary, qkv, positions = _rotary_case(
        dtype, num_heads=num_heads, num_kv_heads=num_kv_heads, seed=11
    )
    weights = (_randn(head_dim, dtype=dtype, seed=8), _randn(head_dim, dtype=dtype, seed=9))
    slot_mapping = torch.tensor([5, 0, -1, 17, 30, 2], dtype=torch.int64, device=DEVICE)
    tables = (rotary.cos_cache, rotary.sin_cache)
    split = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    for fn in (qk_norm_rope, qk_norm_rope_ref):
        plain, fused = qkv.clone(), qkv.clone()
        cache = torch.full((2, 4, 8, num_kv_heads, head_dim), 7.0, dtype=dtype, device=DEVICE)
        fn(plain, positions, *tables, num_heads, num_kv_heads, *weights)
        fn(
            fused,
            positions,
            *tables,
            num_heads,
            num_kv_heads,
            *weights,
            kv_cache=cache,
            slot_mapping=slot_mapping,
        )
        torch.testing.assert_close(fused, plain, atol=0, rtol=0)
        want = torch.full_like(cache, 7.0)
        _, k, v = plain.split(split, dim=-1)
        reshape_and_cache_ref(
            k.reshape(6, num_kv_heads, head_dim),
            v.reshape(6, num_kv_heads, head_dim),
            want,
            slot_mapping,
        )
        torch.testing.assert_close(cache, want, atol=0, rtol=0)


def test_qk_norm_rope_names_bad_cache_arguments() -> None:
    from turnout.kernels.rotary import qk_norm_rope

    rotary, qkv, positions = _rotary_case(torch.float32)
    args = (rotary.cos_cache, rotary.sin_cache, 4, 2)
    cache = torch.zeros(2, 4, 8, 2, 32, device=DEVICE)
    slots = torch.zeros(6, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="give both kv_cache and slot_mapping"):
        qk_norm_rope(qkv, positions, *args, kv_cache=cache)
    with pytest.raises(ValueError, match="kv_cache must be a contiguous"):
        qk_norm_rope(qkv, positions, *args, kv_cache=cache[:, :, :, :1], slot_mapping=slots)
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        qk_norm_rope(qkv, positions, *args, kv_cache=cache, slot_mapping=slots.int())
    with pytest.raises(ValueError, match="slot_mapping must have one entry per token"):
        qk_norm_rope(qkv, positions, *args, kv_cache=cache, slot_mapping=slots[:2])
