"""Test helpers: DeepSeek-V2 configs shrunk from the real DeepSeek-V2-Lite ``config.json``, and
random weights written by HF transformers (``from_config`` + ``save_pretrained``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"


def deepseek_v2_lite() -> dict[str, Any]:
    """The real DeepSeek-V2-Lite config, without its remote-code ``auto_map``."""
    cfg = json.loads((CONFIGS / "deepseek-v2-lite.json").read_text())["config"]
    return {k: v for k, v in cfg.items() if k != "auto_map"}


def tiny_deepseek_v2(**changes: Any) -> dict[str, Any]:
    """DeepSeek-V2-Lite shrunk 16x in width (the vocabulary to 160) with its ratios kept (kv_lora_rank = hidden / 4,
    qk_nope : qk_rope : v = 2 : 1 : 2, q_lora_rank null, YaRN factor 40 over 4096 positions with
    mscale = mscale_all_dim = 0.707), 3 layers with the first dense, 8 routed experts (top-3) and 2
    shared ones; ``changes`` override any field."""
    cfg = deepseek_v2_lite()
    cfg.update(
        vocab_size=160,
        hidden_size=128,
        intermediate_size=192,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    cfg.update(changes)
    return cfg


#: The variants the parity tests run: V2-Lite's plain q_proj, and full DeepSeek-V2's LoRA'd q
#: path (q_lora_rank; here with mscale != mscale_all_dim, so YaRN scales the cos/sin tables too).
TINY_DEEPSEEK_V2: dict[str, dict[str, Any]] = {
    "lite": tiny_deepseek_v2(),
    "q-lora": tiny_deepseek_v2(
        q_lora_rank=48, rope_scaling={**deepseek_v2_lite()["rope_scaling"], "mscale": 1.0}
    ),
}


def write_hf_random_weights(
    hf_config: dict[str, Any], out_dir: Path, *, seed: int, dtype: torch.dtype = torch.float32
) -> Path:
    """An HF directory written by transformers: the model built with ``from_config``, every
    parameter redrawn (norm weights ``1 + 0.1 N(0,1)``, others ``N(0, 1 / fan_in)``; HF's own
    0.02-std init and zero router would leave near-ties for greedy and routing), then
    ``save_pretrained``."""
    import transformers

    fields = {k: v for k, v in hf_config.items() if k not in ("architectures", "torch_dtype")}
    config = transformers.AutoConfig.for_model(**fields, architectures=hf_config["architectures"])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            x = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * x if p.dim() == 1 else x / p.shape[-1] ** 0.5)
    model.save_pretrained(out_dir)
    return out_dir
