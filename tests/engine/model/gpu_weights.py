"""Test helper: seeded random weights drawn on the GPU itself, for real-size models whose
weights would take minutes to draw on the CPU and, at Qwen3-30B-A3B's 61 GB in bf16, would
not fit the GPU host's disk as a checkpoint. The same scales as
``engine.model.weights.random_tensor``; the values come from CUDA's generator, so they differ
from the CPU-drawn ones of ``write_random_weights``."""

from __future__ import annotations

import zlib

import torch

from turnout.engine.model import DecoderModel, ModelConfig
from turnout.engine.model.loader import build_model
from turnout.engine.model.weights import WeightSource, hf_weight_shapes


def device_random_tensor(name: str, shape: tuple[int, ...], seed: int, device: str) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(
        (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)
    )
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if name.endswith(".bias"):
        return x * 0.02
    if len(shape) == 1:
        return 1.0 + 0.1 * x
    return x if "embed" in name else x / shape[-1] ** 0.5


def device_random_source(config: ModelConfig, seed: int, device: str = "cuda") -> WeightSource:
    return {
        name: (lambda n=name, s=shape: device_random_tensor(n, s, seed, device))
        for name, shape in hf_weight_shapes(config).items()
    }


def load_device_random(
    config: ModelConfig,
    *,
    seed: int,
    dtype: torch.dtype,
    device: str = "cuda",
    attn_backend: str = "auto",
) -> DecoderModel:
    model = build_model(
        config,
        device_random_source(config, seed, device),
        dtype=dtype,
        device=device,
        attn_backend=attn_backend,
    )
    assert isinstance(model, DecoderModel)
    return model
