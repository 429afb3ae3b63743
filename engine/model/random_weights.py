"""``write_random_weights``: an HF safetensors directory with seeded random weights for any
supported config (benchmarks and GPU tests on real shapes without downloading weights)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.weights import hf_weight_shapes, random_tensor


def write_random_weights(
    hf_config: Mapping[str, Any],
    out_dir: str | Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` for ``hf_config`` into ``out_dir``.

    The tensors are :func:`engine.model.weights.random_tensor` of each HF name (so
    ``load_model(ModelConfig.from_hf_dict(hf_config), seed=seed)`` holds the same values), and
    the directory loads in HF transformers too. ``config.json`` is ``hf_config`` as given, with
    ``torch_dtype`` set to ``dtype``. With an FP8 ``quantization_config`` the draw (at
    ``dtype``) is quantised by the format's own rule (``engine.model.fp8_checkpoint``); static
    input scales need calibration, so use :func:`~engine.model.fp8_checkpoint.
    write_fp8_checkpoint` for those.

    Raises:
        ModelConfigError: the config names an unsupported architecture or feature.
        ValueError: a static FP8 scheme (it needs calibration inputs).
    """
    from safetensors.torch import save_file

    config = ModelConfig.from_hf_dict(hf_config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: random_tensor(name, shape, seed).to(dtype)
        for name, shape in hf_weight_shapes(config).items()
    }
    if config.quantization is not None:  # an FP8 quantization_config: quantise the dense draw
        from turnout.engine.model.fp8_checkpoint import quantize_tensors

        def thunk(t: torch.Tensor) -> Callable[[], torch.Tensor]:
            return lambda: t

        lazy = quantize_tensors({k: thunk(t) for k, t in tensors.items()}, config)
        tensors = {k: get() for k, get in lazy.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    dtype_name = str(dtype).removeprefix("torch.")
    written = {**hf_config, "torch_dtype": dtype_name}
    if "dtype" in written:  # transformers >= 5 spelling
        written["dtype"] = dtype_name
    (out / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    return out
