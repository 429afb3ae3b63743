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
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
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


def hf_state_of(ours: Any) -> dict[str, torch.Tensor]:
    """Our decoder's tensors under transformers 5's in-memory names (views: no copy), for a
    transformers model that shares our weights. Fused projections are split into views;
    stacked experts are transformers 5's own layout (``experts.gate_up_proj [E, 2I, H]``)."""
    from turnout.engine.model.moe import SparseMoeBlock

    c = ours.config
    state = {
        "model.embed_tokens.weight": ours.model.embed_tokens.weight,
        "model.norm.weight": ours.model.norm.weight,
        "lm_head.weight": ours.lm_head.weight,
    }
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    for n, layer in enumerate(ours.model.layers):
        p, attn = f"model.layers.{n}.", layer.self_attn
        for part, sl in (
            ("q_proj", slice(0, q)),
            ("k_proj", slice(q, q + kv)),
            ("v_proj", slice(q + kv, None)),
        ):
            state[f"{p}self_attn.{part}.weight"] = attn.qkv_proj.weight[sl]
            if attn.qkv_proj.bias is not None:
                state[f"{p}self_attn.{part}.bias"] = attn.qkv_proj.bias[sl]
        state[f"{p}self_attn.o_proj.weight"] = attn.o_proj.weight
        if attn.o_proj.bias is not None:
            state[f"{p}self_attn.o_proj.bias"] = attn.o_proj.bias
        if attn.q_norm is not None:
            state[f"{p}self_attn.q_norm.weight"] = attn.q_norm.weight
            state[f"{p}self_attn.k_norm.weight"] = attn.k_norm.weight
        state[f"{p}input_layernorm.weight"] = layer.input_layernorm.weight
        state[f"{p}post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        mlp = layer.mlp
        if not isinstance(mlp, SparseMoeBlock):
            state |= _gated_mlp(f"{p}mlp.", mlp)
        elif c.moe.family == "granitemoe":
            state |= {
                f"{p}block_sparse_moe.router.weight": mlp.gate.weight,
                f"{p}block_sparse_moe.experts.gate_up_proj": mlp.experts.w13,
                f"{p}block_sparse_moe.experts.down_proj": mlp.experts.w2,
            }
        else:
            state |= {
                f"{p}mlp.gate.weight": mlp.gate.weight,
                f"{p}mlp.experts.gate_up_proj": mlp.experts.w13,
                f"{p}mlp.experts.down_proj": mlp.experts.w2,
            }
            if mlp.shared_expert is not None:
                state |= _gated_mlp(f"{p}mlp.shared_expert.", mlp.shared_expert)
            if mlp.shared_expert_gate is not None:
                state[f"{p}mlp.shared_expert_gate.weight"] = mlp.shared_expert_gate.weight
    return state


def _gated_mlp(prefix: str, mlp: Any) -> dict[str, torch.Tensor]:
    gate, up = mlp.gate_up_proj.weight.chunk(2)
    return {
        prefix + "gate_proj.weight": gate,
        prefix + "up_proj.weight": up,
        prefix + "down_proj.weight": mlp.down_proj.weight,
    }


def hf_model_sharing(ours: Any, hf_config: dict[str, Any]) -> Any:
    """A transformers model of ``hf_config`` built on the meta device whose parameters are our
    model's tensors (no second copy of the weights: a 61 GB Qwen3-30B-A3B fits once), eager
    attention and experts, in eval mode."""
    import transformers

    fields = {k: v for k, v in hf_config.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(hf_config["model_type"], **fields)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    hf.load_state_dict(hf_state_of(ours), strict=True, assign=True)
    device = ours.lm_head.weight.device
    rotary = hf.model.rotary_emb  # its inv_freq buffer is not a checkpoint tensor: rebuild it
    hf.model.rotary_emb = type(rotary)(config=hf.config).to(device)
    return hf.eval()
