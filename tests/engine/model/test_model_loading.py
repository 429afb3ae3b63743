"""Weight loading: safetensors dirs, seeded random weights, meta-device assignment, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import (
    DecoderModel,
    ModelConfig,
    WeightLoadError,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    load_model,
    write_random_weights,
)
from turnout.engine.model.loader import build_model
from turnout.engine.model.weights import random_source

QWEN3 = TINY_DECODER_CONFIGS["qwen3"]


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.state_dict())


def test_random_config_equals_written_directory(tmp_path: Path) -> None:
    config = ModelConfig.from_hf_dict(QWEN3)
    write_random_weights(QWEN3, tmp_path, dtype=torch.float32, seed=5)
    from_dir, from_config = _params(load_model(tmp_path)), _params(load_model(config, seed=5))
    assert from_dir.keys() == from_config.keys()
    assert all(torch.equal(from_dir[k], from_config[k]) for k in from_dir)
    other = _params(load_model(config, seed=6))
    assert not torch.equal(
        other["model.embed_tokens.weight"], from_dir["model.embed_tokens.weight"]
    )


def test_dummy_load_format_reads_only_config_json(tmp_path: Path) -> None:
    # vLLM's --load-format dummy: a directory with config.json and no weights loads with
    # seeded random weights; on the CPU they are exactly those of the ModelConfig path.
    (tmp_path / "config.json").write_text(json.dumps(QWEN3))
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        load_model(tmp_path)
    dummy = _params(load_model(tmp_path, load_format="dummy", seed=5))
    reference = _params(load_model(ModelConfig.from_hf_dict(QWEN3), seed=5))
    assert dummy.keys() == reference.keys()
    assert all(torch.equal(dummy[k], reference[k]) for k in dummy)


def test_unknown_or_misplaced_load_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3))
    with pytest.raises(ValueError, match="load_format must be one of"):
        load_model(tmp_path, load_format="pt")
    with pytest.raises(FileNotFoundError, match="needs an HF model directory"):
        load_model(tmp_path / "config.json", load_format="dummy")


def test_written_directory_is_hf_shaped(tmp_path: Path) -> None:
    write_random_weights(QWEN3, tmp_path, dtype=torch.bfloat16, seed=0)
    tensors = load_file(tmp_path / "model.safetensors")
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (6 * 32, 64)
    assert tensors["model.layers.0.self_attn.q_norm.weight"].dtype == torch.bfloat16
    assert "lm_head.weight" not in tensors  # tied
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["architectures"] == ["Qwen3ForCausalLM"]


def test_load_in_bfloat16_ties_head_and_builds_rope(tmp_path: Path) -> None:
    model = load_model(ModelConfig.from_hf_dict(QWEN3), dtype=torch.bfloat16)
    assert isinstance(model, DecoderModel) and not model.training
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p.dtype == torch.bfloat16 and not p.is_meta for p in model.parameters())
    assert model.model.rotary_emb.cos_cache.shape == (256, 16)


def test_each_tensor_is_read_once_into_a_meta_built_model() -> None:
    config = ModelConfig.from_hf_dict(TINY_DECODER_CONFIGS["llama"])
    reads: list[str] = []
    source = {
        name: (lambda n=name, g=get: reads.append(n) or g())
        for name, get in random_source(config, 0).items()
    }
    model = build_model(config, source, dtype=torch.float32, device="cpu")
    assert sorted(reads) == sorted(source) and len(reads) == len(set(reads))
    assert not any(t.is_meta for t in model.state_dict().values())


def _corrupt(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    write_random_weights(TINY_DECODER_CONFIGS["llama"], tmp_path, dtype=torch.float32)
    tensors = load_file(tmp_path / "model.safetensors")
    edit(tensors)
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    path = _corrupt(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(WeightLoadError, match=r"lacks 1 tensors: model\.layers\.1\.mlp\.up_proj"):
        load_model(path)


def test_unexpected_tensor_is_named(tmp_path: Path) -> None:
    path = _corrupt(tmp_path, lambda t: t.update({"model.layers.0.extra.weight": torch.ones(2)}))
    with pytest.raises(WeightLoadError, match=r"does not use: model\.layers\.0\.extra\.weight"):
        load_model(path)


def test_misshaped_tensor_is_named(tmp_path: Path) -> None:
    path = _corrupt(tmp_path, lambda t: t.update({"model.norm.weight": torch.ones(3)}))
    with pytest.raises(WeightLoadError, match=r"model\.norm\.weight: checkpoint shape \(3,\)"):
        load_model(path)


def test_tied_checkpoint_may_also_store_the_head(tmp_path: Path) -> None:
    write_random_weights(QWEN3, tmp_path, dtype=torch.float32)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, tmp_path / "model.safetensors")
    model = load_model(tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="attn_backend"):
        load_model(ModelConfig.from_hf_dict(QWEN3), attn_backend="flash")


def test_kv_cache_layout() -> None:
    config = ModelConfig.from_hf_dict(QWEN3)
    caches = allocate_kv_caches(
        config, num_blocks=10, block_size=16, dtype=torch.bfloat16, device="cpu"
    )
    assert len(caches) == 2 and caches[0].shape == (2, 10, 16, 2, 32)
    assert caches[0].dtype == torch.bfloat16 and not caches[0].any()
    per_block = sum(c[:, 0].numel() * c.element_size() for c in caches)
    assert kv_cache_bytes_per_block(config, 16, torch.bfloat16) == per_block
    with pytest.raises(ValueError, match="num_blocks"):
        allocate_kv_caches(config, 0, 16, torch.float32, "cpu")
