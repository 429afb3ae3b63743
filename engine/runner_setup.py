"""Set-up steps both runners take the same way: load the model and check it against the engine's
config, and the two numbers the engine sizes the KV cache from (``runner_loader``).

Imported by the runner packages only (it loads torch and the model layer).
"""

from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig
from engine.errors import EngineConfigError
from engine.model import DecoderModel, EncoderModel, load_model

logger = logging.getLogger("turnout.engine")


def load_engine_model(config: EngineConfig, dtype: torch.dtype, device: torch.device
                      ) -> DecoderModel | EncoderModel:
    """``config.model`` loaded in ``dtype`` on ``device``; logs its quantization report
    (``engine.model.quantization``) on the ``turnout.engine`` logger.

    Raises:
        EngineConfigError: the model's ``vocab_size`` is not ``config.vocab_size``.
        ModelConfigError, WeightLoadError: from :func:`engine.model.load_model`.
    """
    model = load_model(config.model, dtype=dtype, device=device)
    # What the weights are and how they run (FP8 W8A8 or dequantised, GGUF dequantised).
    logger.info("%s", model.quantization_report)
    if model.config.vocab_size != config.vocab_size:
        raise EngineConfigError(
            f"the engine expects vocab_size {config.vocab_size}, the model has {model.config.vocab_size}"
        )
    return model


def kv_block_bytes(model: DecoderModel | EncoderModel | None, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block of ``block_size`` slots takes over all layers, as the model's
    ``kv_cache_spec`` lays it out (keys and values per kv head, or MLA's latent rows); 0 for an
    encoder, which keeps no KV cache."""
    assert model is not None, "load_model() first"
    if isinstance(model, EncoderModel):
        return 0
    return model.kv_cache_spec.bytes_per_block(block_size, dtype)


def kv_cache_budget(device: torch.device, gpu_fraction: float, cpu_bytes: int) -> int:
    """Bytes the KV cache may take: ``gpu_fraction`` of the GPU memory free now (after the model
    is loaded), or ``cpu_bytes`` on the CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * gpu_fraction)
    return cpu_bytes


__all__ = ["kv_block_bytes", "kv_cache_budget", "load_engine_model"]
