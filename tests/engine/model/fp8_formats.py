"""``quantization_config`` mappings of the FP8 checkpoint formats, as their producers write them
(vLLM's fp8 method / AutoFP8, HF FineGrainedFP8 for blocks, llm-compressor's compressed-tensors),
and a helper that writes an FP8 checkpoint of a tiny config plus its dequantised HF copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from turnout.engine.model import write_random_weights
from turnout.engine.model.fp8_checkpoint import (
    calibrate_input_amax,
    dequantize_checkpoint,
    write_fp8_checkpoint,
)


def _ct_group(weights: dict[str, Any], acts: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "output_activations": None,
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "symmetric": True,
                    "dynamic": False,
                    "group_size": None,
                    "observer": "minmax",
                    **weights,
                },
                "input_activations": acts,
            }
        },
    }


_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
_STATIC = {
    "num_bits": 8,
    "type": "float",
    "symmetric": True,
    "strategy": "tensor",
    "dynamic": False,
}

FP8_FORMATS: dict[str, dict[str, Any]] = {
    # vLLM fp8 / AutoFP8: scalar weight_scale per projection, dynamic activations
    "fp8-tensor-dynamic": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": ["lm_head"],
    },
    # ... with a calibrated scalar input_scale
    "fp8-tensor-static": {
        "quant_method": "fp8",
        "activation_scheme": "static",
        "ignored_layers": ["lm_head"],
    },
    # HF FineGrainedFP8 / DeepSeek-V3 style: weight_scale_inv per 32x32 block (128x128 in real
    # checkpoints; the tiny layers are 64 wide)
    "fp8-block": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [32, 32],
        "modules_to_not_convert": ["lm_head"],
    },
    # llm-compressor FP8_DYNAMIC: weight_scale [out, 1], dynamic per-token activations
    "ct-channel-dynamic": _ct_group({"strategy": "channel"}, _TOKEN),
    # llm-compressor FP8 (static): weight_scale [1] and input_scale [1]
    "ct-tensor-static": _ct_group({"strategy": "tensor"}, _STATIC),
    # weight-only FP8 (W8A16)
    "ct-channel-weight-only": _ct_group({"strategy": "channel"}, None),
}


def write_fp8_pair(
    hf_config: dict[str, Any], fmt: str, root: Path, *, seed: int = 3
) -> tuple[Path, Path]:
    """``(fp8_dir, dense_dir)``: random fp32 weights for ``hf_config`` quantised into format
    ``fmt`` (static input scales calibrated on HF transformers' own forward of random
    prompts), and their dequantised copy, which HF transformers loads as a plain checkpoint."""
    import transformers

    dense = write_random_weights(hf_config, root / "dense", dtype=torch.float32, seed=seed)
    amax = None
    if "static" in fmt:
        hf = transformers.AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(0)
        amax = calibrate_input_amax(
            hf, [torch.randint(3, hf_config["vocab_size"], (2, 24), generator=gen)]
        )
    fp8 = write_fp8_checkpoint(dense, root / fmt, FP8_FORMATS[fmt], input_amax=amax)
    return fp8, dequantize_checkpoint(fp8, root / f"{fmt}-dequantised")
