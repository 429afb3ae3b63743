"""hf_config_to_fields on the real config.json files of policies/reference/model_configs/: every
DeploymentConfig field a config.json determines, read as vLLM reads it, and agreeing with the
turnout pack's families.yaml wherever both state a fact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from turnout.oracle import DeploymentConfig, from_hf_config, load_pack
from turnout.oracle.sources import hf_config_to_fields

CONFIGS = Path(__file__).resolve().parents[2] / "policies" / "reference" / "model_configs"


def _real_configs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(CONFIGS.glob("*.json")):
        data = json.loads(path.read_text())
        for key in ("config", "config_v0_3"):
            if isinstance(data.get(key), dict):
                out.append((path.stem, data[key]))
        for example in data.get("examples", []):
            if isinstance(example.get("config"), dict):
                out.append((f"{path.stem}:{example['model_id']}", example["config"]))
    return out


REAL = dict(_real_configs())
#: (attention heads, KV heads) as vLLM's ModelArchConfigConvertor reads them: KV heads from
#: num_key_value_heads, else the attention heads (BERT, OPT). Mamba states none (vLLM: 0).
#: ``vocab_size`` as each model's card states it (vLLM ModelConfig.get_vocab_size): the draft
#: vocabulary check compares the target's with the draft's.
VOCAB: dict[str, int] = {
    "all-minilm-l6-v2": 30522,
    "bge-small-en-v1.5": 30522,
    "deepseek-v2-lite": 102400,
    "granite-3.0-1b-a400m": 49152,
    "jamba-v0.1": 65536,
    "llama-3.1-8b": 128256,
    "mamba-130m": 50280,
    "mistral-7b": 32768,
    "ms-marco-minilm-l6-v2-cross-encoder": 30522,
    "opt-125m": 50272,
    "quantized-examples:LDCC/Qwen2.5-72B-Instruct-ko-AWQ": 152064,
    "qwen1.5-moe-a2.7b": 151936,
    "qwen3-0.6b": 151936,
    "qwen3-30b-a3b": 151936,
    "qwen3-8b": 151936,
    "skywork-reward-llama-3.1-8b": 128257,  # one token added to Llama 3.1's for the reward head
}

HEADS: dict[str, tuple[int, int]] = {
    "all-minilm-l6-v2": (12, 12),
    "bge-small-en-v1.5": (12, 12),
    "deepseek-v2-lite": (16, 16),
    "granite-3.0-1b-a400m": (16, 8),
    "jamba-v0.1": (32, 8),
    "llama-3.1-8b": (32, 8),
    "mistral-7b": (32, 8),
    "ms-marco-minilm-l6-v2-cross-encoder": (12, 12),
    "opt-125m": (12, 12),
    "quantized-examples:LDCC/Qwen2.5-72B-Instruct-ko-AWQ": (64, 8),
    "qwen1.5-moe-a2.7b": (16, 16),
    "qwen3-0.6b": (16, 8),
    "qwen3-30b-a3b": (32, 4),
    "qwen3-8b": (32, 8),
    "skywork-reward-llama-3.1-8b": (32, 8),
}
_NO = {"has_index_topk": False}
WANT: dict[str, dict[str, Any]] = {
    "all-minilm-l6-v2": {"architecture": "BertModel", "model_type": "bert", "hidden_size": 384},
    "bge-small-en-v1.5": {"architecture": "BertModel", "model_type": "bert", "hidden_size": 384},
    "deepseek-v2-lite": {
        "architecture": "DeepseekV2ForCausalLM",
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "is_moe": True,
        "use_mla": True,
    },
    "granite-3.0-1b-a400m": {
        "architecture": "GraniteMoeForCausalLM",
        "model_type": "granitemoe",
        "hidden_size": 1024,
        "is_moe": True,
    },
    "jamba-v0.1": {
        "architecture": "JambaForCausalLM",
        "model_type": "jamba",
        "hidden_size": 4096,
        "is_moe": True,
        "has_inner_state": True,
        "is_hybrid": True,
    },
    "llama-3.1-8b": {
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "hidden_size": 4096,
    },
    "mamba-130m": {
        "architecture": "MambaForCausalLM",
        "model_type": "mamba",
        "hidden_size": 768,
        "has_inner_state": True,
        "attention_free": True,
        # no attention heads: vLLM reads 0 for both (get_total_num_attention_heads)
        "num_attention_heads": 0,
        "num_key_value_heads": 0,
    },
    "mistral-7b": {
        "architecture": "MistralForCausalLM",
        "model_type": "mistral",
        "hidden_size": 4096,
    },
    "ms-marco-minilm-l6-v2-cross-encoder": {
        "architecture": "BertForSequenceClassification",
        "model_type": "bert",
        "hidden_size": 384,
    },
    "opt-125m": {"architecture": "OPTForCausalLM", "model_type": "opt", "hidden_size": 768},
    "quantized-examples:LDCC/Qwen2.5-72B-Instruct-ko-AWQ": {
        "architecture": "Qwen2ForCausalLM",
        "model_type": "qwen2",
        "hidden_size": 8192,
        "quantization": "awq",
    },
    "qwen1.5-moe-a2.7b": {
        "architecture": "Qwen2MoeForCausalLM",
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "is_moe": True,
    },
    "qwen3-0.6b": {"architecture": "Qwen3ForCausalLM", "model_type": "qwen3", "hidden_size": 1024},
    "qwen3-30b-a3b": {
        "architecture": "Qwen3MoeForCausalLM",
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "is_moe": True,
    },
    "qwen3-8b": {"architecture": "Qwen3ForCausalLM", "model_type": "qwen3", "hidden_size": 4096},
    "skywork-reward-llama-3.1-8b": {
        "architecture": "LlamaForSequenceClassification",
        "model_type": "llama",
        "hidden_size": 4096,
    },
}


def test_every_real_config_is_covered() -> None:
    assert set(REAL) == set(WANT)


@pytest.mark.parametrize("name", sorted(WANT))
def test_real_config_fields(name: str) -> None:
    want = {**WANT[name], **_NO}
    if name in HEADS:
        want["num_attention_heads"], want["num_key_value_heads"] = HEADS[name]
    if name in VOCAB:
        want["vocab_size"] = VOCAB[name]
    assert hf_config_to_fields(REAL[name]) == want
    DeploymentConfig(**hf_config_to_fields(REAL[name]))  # every one a valid field value


@pytest.mark.parametrize("name", sorted(WANT))
def test_a_config_and_families_yaml_agree_on_what_both_state(name: str) -> None:
    fields = hf_config_to_fields(REAL[name])
    info = load_pack("turnout").architectures[fields["architecture"]]
    for key in (
        "is_moe",
        "use_mla",
        "has_inner_state",
        "is_hybrid",
        "attention_free",
        "is_multimodal",
        "is_encoder_decoder",
        "has_index_topk",
    ):
        if key in fields:
            assert fields[key] == getattr(info, key), (key, info)


def _with(name: str, **changes: Any) -> dict[str, Any]:
    return {**REAL[name], **changes}


def test_a_sparse_attention_indexer_is_index_topk() -> None:
    v32 = _with(
        "deepseek-v2-lite",
        architectures=["DeepseekV32ForCausalLM"],
        model_type="deepseek_v32",
        index_topk=2048,
    )
    fields = hf_config_to_fields(v32)
    assert fields["has_index_topk"] is True and fields["use_mla"] is True
    assert from_hf_config(v32).has_index_topk is True


def test_hidden_size_comes_from_the_text_config_as_vllm_reads_it() -> None:
    vl = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "hidden_size": 1280,
        "text_config": {"hidden_size": 3584, "num_experts": 0},
        "vision_config": {"hidden_size": 1280},
    }
    fields = hf_config_to_fields(vl)
    assert fields["hidden_size"] == 3584 and fields["is_multimodal"] is True
    assert "is_moe" not in fields
    assert (
        hf_config_to_fields({"architectures": ["GPT2LMHeadModel"], "n_embd": 768})["hidden_size"]
        == 768
    )


@pytest.mark.parametrize(
    "quantization_config, want",
    [
        ({"quant_method": "compressed_tensors"}, "compressed-tensors"),
        ({"quant_method": "FP8"}, "fp8"),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}, "modelopt"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt_fp4"),
        ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, "modelopt_mxfp8"),
        ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, "modelopt_mixed"),
        ({"quant_method": "modelopt"}, "modelopt"),
        ({"bits": 4}, None),
    ],
)
def test_quantization_in_vllm_spelling(
    quantization_config: dict[str, Any], want: str | None
) -> None:
    fields = hf_config_to_fields(_with("qwen3-8b", quantization_config=quantization_config))
    assert fields.get("quantization") == want


@pytest.mark.parametrize(
    "layout, want",
    [
        (
            {"layer_types": ["mamba", "attention", "mamba"]},
            {"has_inner_state": True, "is_hybrid": True},
        ),
        ({"layers_block_type": ["mamba", "mamba"]}, {"has_inner_state": True, "is_hybrid": False}),
        ({"hybrid_override_pattern": "M-M-M*-M-"}, {"has_inner_state": True, "is_hybrid": True}),
        ({"layer_types": ["sliding_attention", "full_attention"]}, {}),
        ({"model_type": "mamba2"}, {"has_inner_state": True, "attention_free": True}),
    ],
)
def test_state_space_layers(layout: dict[str, Any], want: dict[str, Any]) -> None:
    fields = hf_config_to_fields({"architectures": ["X"], **layout})
    got = {k: fields[k] for k in ("has_inner_state", "is_hybrid", "attention_free") if k in fields}
    assert got == want
