"""GGUF loading on files written here the way llama.cpp's converter writes them (q/k rows
permuted for `llama`, not for `qwen2`/`qwen3`; one tensor quantised to Q8_0): the loaded model
equals the HF directory it came from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from paged_session import PagedSession
from safetensors.torch import load_file
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import ModelConfigError, WeightLoadError, load_model, write_random_weights
from turnout.engine.model.gguf_loader import (
    PlainGGUFReader,
    hf_tensor_name,
    open_gguf,
    unpermute_qk,
)

gguf = pytest.importorskip("gguf")
_GGUF_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `permute`: each head's halves become interleaved pairs."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _gguf_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        _, _, layer, rest = hf_name.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        return f"blk.{layer}.{_GGUF_PARTS[module]}.{leaf}"
    return {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }[hf_name]


def write_gguf(
    hf_dir: Path,
    out: Path,
    arch: str,
    *,
    extra_tensor: str | None = None,
    tokens: list[str] | None = None,
) -> None:
    cfg = load_model(hf_dir).config
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    if tokens is not None:
        writer.add_token_list(tokens)
        writer.add_token_scores([float(i) for i in range(len(tokens))])
    for name, t in load_file(hf_dir / "model.safetensors").items():
        w = t.numpy()
        if arch == "llama" and ".q_proj." in name:
            w = llama_cpp_permute(w, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            w = llama_cpp_permute(w, cfg.num_key_value_heads)
        if name == "model.layers.0.mlp.up_proj.weight":  # exercise a quantised type
            q = gguf.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(
                _gguf_name(name), q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0
            )
        else:
            writer.add_tensor(_gguf_name(name), w)
    if extra_tensor:
        writer.add_tensor(extra_tensor, np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("config", "arch"), [("llama", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3")]
)
def test_gguf_model_equals_its_hf_source(tmp_path: Path, config: str, arch: str) -> None:
    hf_dir = write_random_weights(
        TINY_DECODER_CONFIGS[config], tmp_path / "hf", dtype=torch.float32, seed=11
    )
    write_gguf(hf_dir, tmp_path / "m.gguf", arch)
    want, got = load_model(hf_dir), load_model(tmp_path / "m.gguf")
    assert got.config.architecture == want.config.architecture
    assert got.config.tie_word_embeddings == want.config.tie_word_embeddings
    up = "model.layers.0.mlp.gate_up_proj.weight"
    for name, tensor in want.state_dict().items():
        if name != up:
            assert torch.equal(got.state_dict()[name], tensor), name
    torch.testing.assert_close(got.state_dict()[up], want.state_dict()[up], atol=0.02, rtol=0)
    want.model.layers[0].mlp.gate_up_proj.weight.copy_(got.state_dict()[up])  # same Q8_0 values
    prompt = list(range(3, 30))
    logits = []
    for model in (want, got):
        session = PagedSession(model, num_blocks=16, block_size=8)
        session.add("r", prompt)
        logits.append(session.step({"r": len(prompt)})["r"].log_softmax(-1))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=0)


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(6 * 8, 3)
    permuted = torch.from_numpy(llama_cpp_permute(w.numpy(), 6))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_qk(permuted, 6), w)


def test_unknown_tensor_and_architecture_are_named(tmp_path: Path) -> None:
    hf_dir = write_random_weights(
        TINY_DECODER_CONFIGS["llama"], tmp_path / "hf", dtype=torch.float32
    )
    write_gguf(hf_dir, tmp_path / "extra.gguf", "llama", extra_tensor="rope_freqs.weight")
    with pytest.raises(WeightLoadError, match="rope_freqs"):
        load_model(tmp_path / "extra.gguf")
    write_gguf(hf_dir, tmp_path / "gemma.gguf", "gemma")
    with pytest.raises(ModelConfigError, match="'gemma' is not supported"):
        load_model(tmp_path / "gemma.gguf")
    assert hf_tensor_name("blk.2.ffn_down.weight") == "model.layers.2.mlp.down_proj.weight"


def test_the_parse_is_kept_until_the_file_changes(tmp_path: Path) -> None:
    hf_dir = write_random_weights(
        TINY_DECODER_CONFIGS["llama"], tmp_path / "hf", dtype=torch.float32
    )
    path = tmp_path / "m.gguf"
    write_gguf(hf_dir, path, "llama")
    first, meta = open_gguf(path)
    meta["general.architecture"] = "changed by a caller"
    again, meta_again = open_gguf(path)
    assert again is first and meta_again["general.architecture"] == "llama"
    write_gguf(hf_dir, path, "gemma")  # rewritten in place: parsed again
    assert open_gguf(path)[1]["general.architecture"] == "gemma"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ModelConfigError, match="not a readable GGUF file"):
        open_gguf(path)


def test_the_plain_reader_reads_what_gguf_reads(tmp_path: Path) -> None:
    """``PlainGGUFReader`` only swaps the memory map for a plain view of it: every header field
    (scalars, strings, string and float arrays) and every tensor (type, shape, bytes) must equal
    the library reader's. HF's own GGUF loader is run through it in test_smollm2_gguf."""
    hf_dir = write_random_weights(
        TINY_DECODER_CONFIGS["qwen3"], tmp_path / "hf", dtype=torch.float32, seed=3
    )
    path = tmp_path / "m.gguf"
    write_gguf(hf_dir, path, "qwen3", tokens=[f"tok{i}é" for i in range(300)])
    want, got = gguf.GGUFReader(path), PlainGGUFReader(path)
    assert type(got.data) is np.ndarray and isinstance(want.data, np.memmap)
    assert list(got.fields) == list(want.fields) and len(want.fields) > 10
    for name, field in want.fields.items():
        other = got.fields[name]
        assert (other.offset, other.types, other.data) == (field.offset, field.types, field.data)
        assert [bytes(p) for p in other.parts] == [bytes(p) for p in field.parts], name
    assert want.fields["tokenizer.ggml.tokens"].types[0] == gguf.GGUFValueType.ARRAY
    assert len(got.tensors) == len(want.tensors) > 5
    for a, b in zip(want.tensors, got.tensors, strict=True):
        assert (b.name, b.tensor_type, list(b.shape), b.n_bytes) == (
            a.name,
            a.tensor_type,
            list(a.shape),
            a.n_bytes,
        )
        assert type(b.data) is np.ndarray and np.array_equal(b.data, a.data), a.name
