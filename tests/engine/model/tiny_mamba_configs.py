"""A shrunk Mamba-130m config (from policies/reference/model_configs/mamba-130m.json) and a writer
that lets HF transformers draw and save its random weights (``MambaForCausalLM(config)`` then
``save_pretrained``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"
MAMBA_130M: dict[str, Any] = json.loads((CONFIGS / "mamba-130m.json").read_text())["config"]

#: 2 layers, hidden 64, d_inner 128, d_state 8, dt_rank 8, conv width 4 (the real one).
TINY_MAMBA: dict[str, Any] = {
    **MAMBA_130M,
    "vocab_size": 160,
    "hidden_size": 64,
    "d_model": 64,
    "intermediate_size": 128,
    "d_inner": 128,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "state_size": 8,
    "time_step_rank": 8,
    "torch_dtype": "float32",
}


def write_hf_mamba(
    hf_config: dict[str, Any], out_dir: Path, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """HF transformers' own random Mamba weights for ``hf_config``, saved to ``out_dir``.

    HF initialises D to 1, the conv and norm weights to fixed values and the embeddings with a
    small std; those are redrawn (norms ``1 + 0.2 N(0,1)``, D ``1 + 0.2 N(0,1)``, biases
    ``0.1 N(0,1)``, embeddings ``N(0,1)``) so that logits have spread (greedy choices are clear)
    and a tensor loaded into the wrong place changes them. ``A_log`` keeps HF's
    ``log(1..d_state)`` (S4D-real) plus noise: the decays stay in Mamba's range.
    """
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(
        **{k: v for k, v in hf_config.items() if not k.startswith("_name")}
    )
    model = transformers.MambaForCausalLM(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith(("norm.weight", "norm_f.weight", ".D")):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("A_log"):
                param.add_(0.1 * torch.randn_like(param))
            elif "embeddings" in name:
                param.normal_(0.0, 1.0)
    model.to(dtype).save_pretrained(out_dir)
    return out_dir
