"""``write_random_weights``: an HF safetensors directory with seeded random weights for any
supported config (benchmarks and GPU tests on real shapes without downloading weights)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from engine.model.config import ModelConfig
from engine.model.weights import hf_weight_shapes, random_tensor


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
    ``torch_dtype`` set to ``dtype``.

    Raises:
        ModelConfigError: the config names an unsupported architecture or feature.
    """
    from safetensors.torch import save_file

    config = ModelConfig.from_hf_dict(hf_config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: random_tensor(name, shape, seed).to(dtype)
               for name, shape in hf_weight_shapes(config).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    dtype_name = str(dtype).removeprefix("torch.")
    written = {**hf_config, "torch_dtype": dtype_name}
    if "dtype" in written:  # transformers >= 5 spelling
        written["dtype"] = dtype_name
    (out / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    return out
