"""The set-up both runners share (engine/runner_setup.py): the model checked against the engine's
vocabulary, the bytes of a KV block, the CPU budget."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tiny_model_configs import TINY_DECODER_CONFIGS, TINY_REWARD_CONFIGS

from turnout.engine.errors import EngineConfigError
from turnout.engine.model import DecoderModel, ModelConfig, load_model, write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_setup import kv_block_bytes, kv_cache_budget, load_engine_model

LLAMA = TINY_DECODER_CONFIGS["llama"]  # 2 layers, 2 kv heads, head_dim 16, vocab 160
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("setup-llama")
    write_random_weights(LLAMA, path, dtype=torch.float32, seed=3)
    return path


def test_the_model_loads_in_the_engine_dtype(model_dir: Path) -> None:
    model = load_engine_model(engine_config_for(model_dir, device="cpu"), torch.bfloat16, CPU)
    assert isinstance(model, DecoderModel) and model.config.vocab_size == 160
    assert model.lm_head.weight.dtype == torch.bfloat16


def test_a_vocabulary_other_than_the_engines_is_refused(model_dir: Path) -> None:
    config = dataclasses.replace(engine_config_for(model_dir, device="cpu"), vocab_size=161)
    with pytest.raises(
        EngineConfigError, match="the engine expects vocab_size 161, the model has 160"
    ):
        load_engine_model(config, torch.float32, CPU)


def test_kv_block_bytes(model_dir: Path) -> None:
    model = load_model(model_dir)
    # K and V x 2 layers x 4 slots x 2 kv heads x head_dim 16 x 2 bytes
    assert kv_block_bytes(model, 4, torch.bfloat16) == 2 * 2 * 4 * 2 * 16 * 2
    encoder = load_model(
        ModelConfig.from_hf_dict(
            {
                "architectures": ["BertModel"],
                "vocab_size": 50,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "max_position_embeddings": 16,
                "hidden_act": "gelu",
            }
        ),
        seed=1,
    )
    assert kv_block_bytes(encoder, 4, torch.float32) == 0  # an encoder keeps no KV cache
    reward = load_model(ModelConfig.from_hf_dict(TINY_REWARD_CONFIGS["llama-reward"]), seed=1)
    assert kv_block_bytes(reward, 4, torch.float32) == 0  # only a step-local cache, not the pool's


def test_the_cpu_budget_is_the_runners_figure() -> None:
    assert kv_cache_budget(CPU, gpu_fraction=0.9, cpu_bytes=1 << 30) == 1 << 30
