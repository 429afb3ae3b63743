"""Test helper: a transformers DeepseekV2ForCausalLM whose parameters are our model's tensors
(no second copy: DeepSeek-V2-Lite's 31 GB in bf16 are held once), for GPU tests at real size
with weights drawn on the device (tests/engine/model/gpu_weights.py)."""

from __future__ import annotations

from typing import Any

import torch
from hf_moe import _gated_mlp

from turnout.engine.model import DeepseekV2ForCausalLM, SparseMoeBlock


def hf_state_of_deepseek(ours: DeepseekV2ForCausalLM) -> dict[str, torch.Tensor]:
    """Our tensors under transformers 5's in-memory names (views): MLA projections as they
    are, dense MLPs and shared experts split from ``gate_up_proj``, stacked experts in
    transformers' own layout (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj``)."""
    state = {
        "model.embed_tokens.weight": ours.model.embed_tokens.weight,
        "model.norm.weight": ours.model.norm.weight,
        "lm_head.weight": ours.lm_head.weight,
    }
    for n, layer in enumerate(ours.model.layers):
        p = f"model.layers.{n}."
        state |= {f"{p}self_attn.{k}": v for k, v in layer.self_attn.named_parameters()}
        state[f"{p}input_layernorm.weight"] = layer.input_layernorm.weight
        state[f"{p}post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        mlp = layer.mlp
        if not isinstance(mlp, SparseMoeBlock):
            state |= _gated_mlp(f"{p}mlp.", mlp)
            continue
        state |= {
            f"{p}mlp.gate.weight": mlp.gate.weight,
            f"{p}mlp.experts.gate_up_proj": mlp.experts.w13,
            f"{p}mlp.experts.down_proj": mlp.experts.w2,
        }
        if mlp.shared_expert is not None:
            state |= _gated_mlp(f"{p}mlp.shared_experts.", mlp.shared_expert)
    return state


def hf_deepseek_sharing(ours: DeepseekV2ForCausalLM, hf_config: dict[str, Any]) -> Any:
    """transformers' model of ``hf_config`` built on the meta device, its parameters assigned
    from ours; eager attention and experts; eval mode."""
    import transformers

    fields = {k: v for k, v in hf_config.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model("deepseek_v2", **fields)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    hf.load_state_dict(hf_state_of_deepseek(ours), strict=True, assign=True)
    device = ours.lm_head.weight.device
    rotary = hf.model.rotary_emb  # its inv_freq buffer is not a checkpoint tensor: rebuild it
    hf.model.rotary_emb = type(rotary)(config=hf.config).to(device)
    return hf.eval()
