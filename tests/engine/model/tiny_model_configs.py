"""Tiny HF configs of every supported architecture (parity tests, CPU and GPU), some shrunk from
the real configs the project keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_BASE: dict[str, Any] = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    hidden_act="silu",
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)

TINY_DECODER_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "llama3-rope-tied": {
        **_BASE,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "llama-bias-mha": {
        **_BASE,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_key_value_heads": 4,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "mistral-sliding-window": {
        **_BASE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "sliding_window": 8,
        "num_key_value_heads": 1,
    },
    "qwen2": {
        **_BASE,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "rope_theta": 1000000.0,
    },
    "qwen3": {
        **_BASE,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 32,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "rope_theta": 1000000.0,
        "num_attention_heads": 6,
    },
}

# MoE configs shrunk from policies/reference/model_configs/ (qwen1.5-moe-a2.7b.json,
# qwen3-30b-a3b.json, granite-3.0-1b-a400m.json): few layers, a small hidden size and few
# experts, the structure kept (Qwen2-MoE's shared expert and gate, an mlp_only layer; Qwen3's
# explicit head_dim and norm_topk_prob; Granite's multipliers and tied embeddings). Weights
# for these are drawn and written by transformers itself (tests/engine/model/hf_moe.py), with
# a wider initializer_range than its 0.02 so that logits spread (std ~0.8 instead of ~0.16).
_MOE_BASE: dict[str, Any] = dict(
    vocab_size=160,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.1,
)

TINY_MOE_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-moe": {
        **_MOE_BASE,
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "num_hidden_layers": 3,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 80,
        "num_experts": 12,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
        "norm_topk_prob": False,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 21,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "qwen3-moe": {
        **_MOE_BASE,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 2,
        "head_dim": 32,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "granite-moe": {
        **_MOE_BASE,
        "architectures": ["GraniteMoeForCausalLM"],
        "model_type": "granitemoe",
        "num_hidden_layers": 2,
        "intermediate_size": 32,
        "num_local_experts": 8,
        "num_experts_per_tok": 4,
        "attention_bias": False,
        "attention_multiplier": 0.015625,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "logits_scaling": 6.0,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
    },
}


#: Tiny HF configs of the encoder architectures (pooling), in the same shape.
TINY_ENCODER_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": 160,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "hidden_act": "gelu",
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    },
    "bert-classifier": {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": 160,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "hidden_act": "gelu",
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
        "label2id": {"negative": 0, "neutral": 1, "positive": 2},
    },
}

#: Real configs the project keeps (policies/reference/model_configs/, sources.md there).
REFERENCE_CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"


def reference_config(name: str) -> dict[str, Any]:
    """The HF config.json of ``REFERENCE_CONFIGS/<name>.json``, as published."""
    return dict(json.loads((REFERENCE_CONFIGS / f"{name}.json").read_text())["config"])


#: cross-encoder/ms-marco-MiniLM-L-6-v2 (BertForSequenceClassification, one label, Identity as
#: sentence-transformers' activation).
MS_MARCO_CROSS_ENCODER = reference_config("ms-marco-minilm-l6-v2-cross-encoder")

#: Skywork/Skywork-Reward-Llama-3.1-8B (LlamaForSequenceClassification, one label) shrunk:
#: 2 layers, hidden 64, 4 heads over 2 kv heads, a 160-token vocabulary whose last id is the
#: added pad token (as 128256 is in the real 128257-token one), transformers' initializer
#: range widened to 0.1 (logits that spread); its Llama 3.1 RoPE scaling kept, with the
#: original context shrunk to 64 so that the scaling acts within max_model_len.
_SKYWORK = reference_config("skywork-reward-llama-3.1-8b")
TINY_REWARD_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-reward": {
        **_SKYWORK,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 160,
        "pad_token_id": 159,
        "bos_token_id": 1,
        "eos_token_id": [2, 3, 4],
        "max_position_embeddings": 256,
        "initializer_range": 0.1,
        "rope_scaling": {**_SKYWORK["rope_scaling"], "original_max_position_embeddings": 64},
    },
}


def tiny_config_for(architecture: str) -> dict[str, Any] | None:
    """The first tiny config of ``architecture`` here or in a family's own tiny configs
    (tiny_opt_configs.py, deepseek_tiny.py, tiny_mamba_configs.py, tiny_jamba_configs.py), or None
    when there is none."""
    from deepseek_tiny import tiny_deepseek_v2
    from tiny_jamba_configs import TINY_JAMBA_CONFIGS
    from tiny_mamba_configs import TINY_MAMBA
    from tiny_opt_configs import TINY_OPT_CONFIGS

    for cfg in (
        *TINY_DECODER_CONFIGS.values(),
        *TINY_ENCODER_CONFIGS.values(),
        *TINY_REWARD_CONFIGS.values(),
        *TINY_OPT_CONFIGS.values(),
        *TINY_MOE_CONFIGS.values(),
        tiny_deepseek_v2(),
        TINY_MAMBA,
        *TINY_JAMBA_CONFIGS.values(),
    ):
        if cfg["architectures"][0] == architecture:
            return cfg
    return None
