"""Damaged model files get an error that names the file and says what is wrong with it: GGUF
files cut anywhere or overwritten, safetensors files cut or garbled, config.json files that are
not a JSON object or hold fields of the wrong type. Never a traceback from deep inside a
parsing library (``turnout generate`` shows these messages with exit code 2)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from test_gguf_loader import write_gguf
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import ModelConfigError, WeightLoadError, load_model, write_random_weights
from turnout.engine.model.tokenizer import load_tokenizer
from turnout.engine.model_info import read_model_config


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_weights(
        TINY_DECODER_CONFIGS["llama"], tmp_path_factory.mktemp("hf"), dtype=torch.float32, seed=5
    )


@pytest.fixture(scope="module")
def gguf_bytes(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    write_gguf(hf_dir, path, "llama")
    return path.read_bytes()


# Where a cut lands: in the magic, the key/values, the tensor infos, the tensor data.
GGUF_CUTS = [0, 3, 30, 200, 600, 1500, 20000, -1000, -1]


@pytest.mark.parametrize("cut", GGUF_CUTS)
def test_a_truncated_gguf_is_named(tmp_path: Path, gguf_bytes: bytes, cut: int) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_bytes[:cut])
    for read in (read_model_config, load_model, load_tokenizer):
        with pytest.raises(
            ModelConfigError, match=rf"{path}: not a readable GGUF file \(truncated or corrupt\)"
        ):
            read(path)


def test_a_garbled_gguf_is_named(tmp_path: Path, gguf_bytes: bytes) -> None:
    rng = random.Random(0)
    noise = bytes(rng.randrange(256) for _ in range(len(gguf_bytes) - 8))
    path = tmp_path / "noise.gguf"
    path.write_bytes(gguf_bytes[:8] + noise)  # the magic and version, then noise
    with pytest.raises(ModelConfigError, match=rf"{path}: not a readable GGUF file"):
        read_model_config(path)
    with pytest.raises(ModelConfigError, match=rf"{path}: not a readable GGUF file"):
        load_tokenizer(path)


@pytest.mark.parametrize("damage", ["empty", "cut", "garbage", "short header"])
def test_a_damaged_safetensors_file_is_named(tmp_path: Path, hf_dir: Path, damage: str) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    data = (hf_dir / "model.safetensors").read_bytes()
    damaged = {
        "empty": b"",
        "cut": data[: len(data) // 2],
        "garbage": bytes(range(256)) * 8,
        "short header": (16).to_bytes(8, "little") + b'{"a": 1}',
    }[damage]
    (model_dir / "model.safetensors").write_bytes(damaged)
    with pytest.raises(
        WeightLoadError,
        match=rf"{model_dir / 'model.safetensors'}: not a readable safetensors file",
    ):
        load_model(model_dir)


BAD_CONFIG_JSON = [
    ("a list", "[1, 2]", r"expected a JSON object, got a list"),
    ("a string", '"llama"', r"expected a JSON object, got a str"),
    ("not UTF-8", b"\xff\xfe{}", r"not UTF-8"),
    ("kv heads a list", {"num_key_value_heads": [2]}, r"num_key_value_heads"),
    ("negative head_dim", {"head_dim": -4}, r"`head_dim` must be a positive integer, got -4"),
    ("eos a word", {"eos_token_id": "end"}, r"eos_token_id"),
]


@pytest.mark.parametrize(
    ("note", "content", "message"), BAD_CONFIG_JSON, ids=[b[0] for b in BAD_CONFIG_JSON]
)
def test_a_bad_config_json_is_named(
    tmp_path: Path, note: str, content: str | bytes | dict, message: str
) -> None:
    path = tmp_path / "config.json"
    if isinstance(content, dict):
        content = json.dumps({**TINY_DECODER_CONFIGS["llama"], **content})
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ModelConfigError, match=rf"{path}: .*{message}"):
        read_model_config(tmp_path)
