"""GPU (`gpu` marker): FP8 W8A8 through ``torch._scaled_mm`` on Hopper against the dequantising
reference.

- One layer at real shapes: ``fp8_linear`` equals a float32 emulation of the same quantised
  product (per-token or static activation scales applied to the FP8 codes) up to the bfloat16
  rounding of the output (relative error <= 1e-2), and stays within e4m3's activation rounding
  of the unquantised-activation reference (relative error <= 6e-2; one e4m3 rounding is at most
  2^-4 relative, RMS 2^-4/sqrt(3) = 3.6%).
- The block-wise layer (1x128 activation tiles, 128x128 weight blocks, ``F.scaled_mm``): the
  same two bounds.
- Whole models at real shapes (Qwen3-0.6B, all 28 layers, compressed-tensors per-channel and
  fp8 128x128 blocks; Llama-3.1-8B dimensions, 2 layers, vLLM fp8 per-tensor): every FP8 layer
  runs ``scaled_mm``, and its logits agree with the same model switched to the reference path:
  row cosine >= 0.99 and top-1 equal at >= 95% (Qwen3) / 85% (Llama's flat random logits) of
  positions (measured on the H200: see docs/model-layer.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fp8_formats import FP8_FORMATS
from logit_agreement import assert_logits_agree
from paged_session import run_paged_forced

from turnout.engine.model import ModelConfig, load_model
from turnout.engine.model.fp8 import (
    FP8_DTYPE,
    Fp8Linear,
    dequantize_fp8,
    fp8_block_linear,
    fp8_linear,
    set_fp8_execution,
)
from turnout.engine.model.fp8_checkpoint import quantize_fp8_weight
from turnout.engine.model.fp8_config import Fp8Scheme
from turnout.kernels.fp8_quant import quantize_fp8_ref

pytestmark = pytest.mark.gpu
CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 4096, 6144), (7, 1024, 3072), (300, 4096, 12288)])
def test_scaled_mm_layer_equals_its_emulation(m: int, k: int, n: int, static: bool) -> None:
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
    q, scale = quantize_fp8_weight(w, Fp8Scheme("channel", "dynamic"))
    scale = scale.reshape(-1)
    input_scale = (x.float().abs().amax() / 448).reshape(()) if static else None
    out = fp8_linear(x, q, scale, input_scale)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    xq, xs = quantize_fp8_ref(x, static_scale=input_scale)
    assert xq.dtype == FP8_DTYPE
    emulated = (xq.float() * xs) @ dequantize_fp8(q, scale).T
    assert _rel(out, emulated) <= 1e-2
    assert _rel(out, x.float() @ dequantize_fp8(q, scale).T) <= 6e-2


@pytest.mark.parametrize("m", [1, 7, 300])
def test_block_scaled_mm_layer_equals_its_emulation(m: int) -> None:
    k, n = 4096, 6144
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
    q, scale = quantize_fp8_weight(w, Fp8Scheme("block", "dynamic", (128, 128)))
    out = fp8_block_linear(x, q, scale.contiguous())
    xq, xs = quantize_fp8_ref(x, group_size=128)
    deq = dequantize_fp8(q, scale, (128, 128))
    emulated = (xq.float() * xs.repeat_interleave(128, 1)) @ deq.T
    assert _rel(out, emulated) <= 1e-2
    assert _rel(out, x.float() @ deq.T) <= 6e-2


#: DeepSeek-V3 / Qwen3-FP8 style 128x128 blocks (the tiny CPU configs use 32x32).
BLOCK_128 = {**FP8_FORMATS["fp8-block"], "weight_block_size": [128, 128]}
FORMATS = {**FP8_FORMATS, "fp8-block-128": BLOCK_128}
EXECUTIONS = {
    "ct-channel-dynamic": "W8A8 through torch._scaled_mm (dynamic per-token activation scales)",
    "fp8-tensor-dynamic": "W8A8 through torch._scaled_mm (dynamic per-token activation scales)",
    "fp8-block-128": "W8A8 through F.scaled_mm (dynamic 1x128 activation scales, 128x128 weight blocks)",
}


def _fp8_config(file: str, fmt: str, num_layers: int | None) -> ModelConfig:
    hf = json.loads((CONFIGS / file).read_text())["config"]
    if num_layers is not None:
        hf["num_hidden_layers"] = num_layers
    return ModelConfig.from_hf_dict({**hf, "quantization_config": FORMATS[fmt]})


# Untied random Llama logits are nearly flat over 128k tokens (N(0, 1/4096) head), so top-1 ties
# flip more often there than in tied Qwen3 (N(0,1) embeddings as the head): a flip passes where
# it is a near tie (logit_agreement), whatever the fraction of rows it touches.
@pytest.mark.parametrize(
    ("file", "fmt", "num_layers"),
    [
        ("qwen3-0.6b.json", "ct-channel-dynamic", None),
        ("qwen3-0.6b.json", "fp8-block-128", None),
        ("llama-3.1-8b.json", "fp8-tensor-dynamic", 2),
    ],
)
def test_scaled_mm_model_agrees_with_the_dequantising_reference(
    file: str, fmt: str, num_layers: int | None
) -> None:
    config = _fp8_config(file, fmt, num_layers)
    model = load_model(config, dtype=torch.bfloat16, device="cuda", seed=1)
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 4 * config.num_hidden_layers and all(
        m.execution == "scaled_mm" for m in layers
    )
    assert EXECUTIONS[fmt] in str(model.quantization_report)
    gen = torch.Generator().manual_seed(0)
    sequences = {
        f"r{i}": torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
        for i, n in enumerate([306, 135, 23, 70])
    }
    chunk = {"r0": 200, "r1": 129, "r2": 5, "r3": 64}
    got = run_paged_forced(model, sequences, block_size=16, first_chunk=chunk, num_decode=6)
    assert set_fp8_execution(model, "reference") == len(layers)
    want = run_paged_forced(model, sequences, block_size=16, first_chunk=chunk, num_decode=6)
    for k in sequences:
        assert_logits_agree(got[k], want[k], f"{file}/{fmt}/{k}", min_cos=0.99)
