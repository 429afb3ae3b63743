"""Tiny HF configs of every supported decoder architecture (parity tests, CPU and GPU)."""

from __future__ import annotations

from typing import Any

_BASE: dict[str, Any] = dict(
    vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2,
)

TINY_DECODER_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "llama3-rope-tied": {
        **_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "tie_word_embeddings": True, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    },
    "llama-bias-mha": {
        **_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_key_value_heads": 4, "attention_bias": True, "mlp_bias": True,
    },
    "mistral-sliding-window": {
        **_BASE, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "sliding_window": 8, "num_key_value_heads": 1,
    },
    "qwen2": {
        **_BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "tie_word_embeddings": True, "use_sliding_window": False, "rope_theta": 1000000.0,
    },
    "qwen3": {
        **_BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32,
        "tie_word_embeddings": True, "use_sliding_window": False, "rope_theta": 1000000.0,
        "num_attention_heads": 6,
    },
}

#: Tiny HF configs of the encoder architectures (pooling), in the same shape.
TINY_ENCODER_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 160, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 64, "hidden_act": "gelu", "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "pad_token_id": 0,
    },
}


def tiny_config_for(architecture: str) -> dict[str, Any] | None:
    """The first tiny config of ``architecture`` here or in a family's own tiny configs
    (tiny_opt_configs.py), or None when there is none."""
    from tiny_opt_configs import TINY_OPT_CONFIGS

    for cfg in (*TINY_DECODER_CONFIGS.values(), *TINY_ENCODER_CONFIGS.values(),
                *TINY_OPT_CONFIGS.values()):
        if cfg["architectures"][0] == architecture:
            return cfg
    return None
