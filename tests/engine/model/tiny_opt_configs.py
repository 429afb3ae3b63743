"""Shrunk OPT configs (from policies/reference/model_configs/opt-125m.json) and a writer that
lets HF transformers draw and save their random weights (``from_config(...).save_pretrained``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"
OPT_125M: dict[str, Any] = json.loads((CONFIGS / "opt-125m.json").read_text())["config"]

#: 2 layers, hidden 64; init_std 0.3 (not 0.02) so that random logits have spread and greedy
#: choices are clear (the init scale is a config field, not part of the architecture).
_SHRUNK: dict[str, Any] = {
    **OPT_125M,
    "vocab_size": 160,
    "hidden_size": 64,
    "word_embed_proj_dim": 64,
    "ffn_dim": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "init_std": 0.3,
    "torch_dtype": "float32",
}

TINY_OPT_CONFIGS: dict[str, dict[str, Any]] = {
    "opt-pre-ln": _SHRUNK,  # opt-125m and every OPT from 1.3b up
    "opt-post-ln": {**_SHRUNK, "do_layer_norm_before": False},
    # opt-350m's shape: post-LN with project_in/project_out around a wider body.
    "opt-post-ln-project": {**_SHRUNK, "do_layer_norm_before": False, "word_embed_proj_dim": 32},
    "opt-pre-ln-project": {**_SHRUNK, "word_embed_proj_dim": 32},
}


def write_hf_opt(
    hf_config: dict[str, Any], out_dir: Path, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """HF transformers' own random OPT weights for ``hf_config``, saved to ``out_dir``.

    HF initialises biases to 0 and LayerNorms to (1, 0); those are redrawn (``0.1 N(0,1)`` and
    ``1 + 0.2 N(0,1)``) so that a bias or norm loaded into the wrong place changes the logits.
    """
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.OPTConfig(
        **{k: v for k, v in hf_config.items() if not k.startswith("_name")}
    )
    model = transformers.OPTForCausalLM(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif "layer_norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
    model.to(dtype).save_pretrained(out_dir)
    return out_dir
