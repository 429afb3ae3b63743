"""Test helper: HF checkpoints of the tiny MoE configs with random weights drawn and written by
transformers itself (``AutoModelForCausalLM.from_config(...).save_pretrained``), float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def write_hf_random_weights(hf_config: dict[str, Any], out_dir: Path, *, seed: int = 0) -> Path:
    """Write ``hf_config``'s model with transformers' own initialisation into ``out_dir``."""
    import transformers

    fields = {k: v for k, v in hf_config.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(hf_config["model_type"], **fields)
    config.architectures = list(hf_config["architectures"])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    return out_dir


def load_hf_reference(path: Path) -> Any:
    """transformers' model of ``path`` in float32, eager attention and eager experts (the
    plain per-expert loop of its modeling files), for fixed-length greedy comparisons."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_moe_dir(tmp_path_factory: Any, name: str) -> Path:
    """The transformers-written checkpoint of ``TINY_MOE_CONFIGS[name]`` (seed 0), written once
    per test session whichever test directory asks first."""
    from tiny_model_configs import TINY_MOE_CONFIGS

    path = Path(tmp_path_factory.getbasetemp()) / "hf-moe" / name
    if not (path / "config.json").is_file():
        write_hf_random_weights(TINY_MOE_CONFIGS[name], path, seed=0)
    return path
