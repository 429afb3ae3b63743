"""Shrunk Jamba configs (from policies/reference/model_configs/jamba-v0.1.json) and a writer that
lets HF transformers draw and save their random weights (``from_config(...).save_pretrained``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"
JAMBA_V01: dict[str, Any] = json.loads((CONFIGS / "jamba-v0.1.json").read_text())["config"]

#: Jamba-v0.1's structure at hidden 64: 8 layers, attention at layers 1 and 5 (period 4, offset
#: 1), experts on the odd layers (period 2, offset 1), so each kind of mixer meets both kinds
#: of feed-forward; 4 experts, top-2; GQA (4 heads, 2 kv heads). initializer_range 0.15 (not
#: 0.02) so that random logits have spread and greedy choices are clear.
_SHRUNK: dict[str, Any] = {
    **{k: v for k, v in JAMBA_V01.items() if k != "auto_map"},
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_period": 4,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "mamba_d_state": 8,
    "mamba_dt_rank": "auto",
    "max_position_embeddings": 256,
    "initializer_range": 0.15,
    "torch_dtype": "float32",
}

TINY_JAMBA_CONFIGS: dict[str, dict[str, Any]] = {
    "jamba": _SHRUNK,
    # Other options: one expert (every feed-forward dense), MHA, attention at layer 2 of 3,
    # biases on in_proj/out_proj, no conv bias, tied embeddings, an explicit dt rank.
    "jamba-dense-variant": {
        **_SHRUNK,
        "num_hidden_layers": 3,
        "attn_layer_period": 3,
        "attn_layer_offset": 2,
        "num_experts": 1,
        "num_key_value_heads": 4,
        "mamba_proj_bias": True,
        "mamba_conv_bias": False,
        "tie_word_embeddings": True,
        "mamba_dt_rank": 6,
        "mamba_d_conv": 3,
    },
}


def write_hf_jamba(
    hf_config: dict[str, Any], out_dir: Path, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """HF transformers' own random Jamba weights for ``hf_config``, saved to ``out_dir``.

    transformers initialises RMSNorms to 1, biases to 0, ``D`` to 1 and ``A_log`` to
    ``log(1..d_state)`` on every channel; those are redrawn (norms and ``D`` ``1 + 0.2 N(0,1)``,
    biases ``0.1 N(0,1)``, ``A_log`` plus ``0.2 N(0,1)``) so that a tensor loaded into the
    wrong place, or a channel permuted, changes the logits.
    """
    import transformers

    torch.manual_seed(seed)
    fields = {
        k: v
        for k, v in hf_config.items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    config = transformers.JambaConfig(**fields)
    config.architectures = ["JambaForCausalLM"]
    model = transformers.JambaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith(("layernorm.weight", ".D")):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith(".A_log"):
                param.add_(0.2 * torch.randn_like(param))
    model.to(dtype).save_pretrained(out_dir)
    return out_dir


def load_hf_jamba(path: Path) -> Any:
    """transformers' Jamba of ``path`` in float32 with eager attention and experts, no EOS."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
