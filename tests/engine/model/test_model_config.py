"""ModelConfig from real HF configs (policies/reference/model_configs) and its clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from turnout.engine.model.config import ModelConfig, ModelConfigError, RopeScaling
from turnout.engine.model.layers import rope_inv_freq

CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"


def _real(name: str, key: str = "config") -> dict[str, Any]:
    return json.loads((CONFIGS / name).read_text())[key]


def test_qwen3_keeps_explicit_head_dim_and_ties() -> None:
    c = ModelConfig.from_hf_dict(_real("qwen3-0.6b.json"))
    assert (c.architecture, c.head_dim, c.num_attention_heads, c.num_key_value_heads) == (
        "Qwen3ForCausalLM",
        128,
        16,
        8,
    )
    assert c.hidden_size // c.num_attention_heads == 64  # not the head_dim
    assert c.tie_word_embeddings and c.has_qk_norm and not c.qkv_bias
    assert (c.rope_theta, c.rope_scaling, c.eos_token_id) == (1_000_000.0, None, 151645)


def test_llama31_reads_llama3_rope_scaling() -> None:
    c = ModelConfig.from_hf_dict(_real("llama-3.1-8b.json"))
    assert c.head_dim == 128 and not c.tie_word_embeddings
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_transformers5_rope_parameters_spelling() -> None:
    d = _real("llama-3.1-8b.json")
    scaling = d.pop("rope_scaling")
    d["rope_parameters"] = {**scaling, "rope_theta": d.pop("rope_theta")}
    assert ModelConfig.from_hf_dict(d) == ModelConfig.from_hf_dict(_real("llama-3.1-8b.json"))


def test_mistral_sliding_window_and_eos_list() -> None:
    v01 = ModelConfig.from_hf_dict(_real("mistral-7b.json", "config_v0_1_architecture_fields"))
    assert v01.sliding_window == 4096
    assert ModelConfig.from_hf_dict(_real("mistral-7b.json", "config_v0_3")).sliding_window is None
    d = {**_real("llama-3.1-8b.json"), "eos_token_id": [128001, 128008, 128009]}
    c = ModelConfig.from_hf_dict(d)
    assert (c.eos_token_id, c.eos_token_ids) == (128001, (128001, 128008, 128009))
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


def test_bert_config() -> None:
    c = ModelConfig.from_hf_dict(_real("all-minilm-l6-v2.json"))
    assert c.is_encoder and (c.hidden_size, c.head_dim, c.layer_norm_eps) == (384, 32, 1e-12)
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


def test_config_is_hashable() -> None:
    a = ModelConfig.from_hf_dict(_real("qwen3-0.6b.json"))
    assert hash(a) == hash(ModelConfig.from_hf_dict(_real("qwen3-0.6b.json")))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"architectures": ["DeepseekV3ForCausalLM"]}, "DeepseekV3ForCausalLM.*not supported"),
        (
            {"architectures": ["DeepseekV2ForCausalLM"]},
            "`kv_lora_rank` must be a positive integer, got None",
        ),
        ({"architectures": None}, "architectures"),
        ({"num_key_value_heads": 5}, "multiple of num_key_value_heads"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not implemented"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_bad_configs_are_named(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict({**_real("llama-3.1-8b.json"), **change})


def test_qwen_layerwise_sliding_window_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="use_sliding_window"):
        ModelConfig.from_hf_dict({**_real("qwen3-0.6b.json"), "use_sliding_window": True})


def test_llama3_inv_freq_bands() -> None:
    # Llama 3.1: high frequencies unchanged, low ones divided by factor, a blend between.
    scaling = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    base = rope_inv_freq(128, 500000.0, None)
    scaled = rope_inv_freq(128, 500000.0, scaling)
    wavelen = 2 * torch.pi / base
    assert torch.equal(scaled[wavelen < 8192 / 4], base[wavelen < 8192 / 4])
    torch.testing.assert_close(scaled[wavelen > 8192], base[wavelen > 8192] / 8)
    mid = (wavelen >= 2048) & (wavelen <= 8192)
    assert mid.any() and (scaled[mid] < base[mid]).all() and (scaled[mid] > base[mid] / 8).all()
