"""JambaForCausalLM: its config from the real Jamba-v0.1 config.json (layer kinds, experts, the
hybrid cache layout), tensor names and shapes equal to what transformers saves, refusals by
name, and our model equal to HF transformers on HF's own random weights (fp32): the logits of
every position through chunked prefill, decodes and scrambled KV blocks and state slots within
1e-4, greedy continuations equal to HF ``generate``, and a reused state slot carrying nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from paged_session import PagedSession, run_paged_forced, run_paged_greedy
from tiny_jamba_configs import JAMBA_V01, TINY_JAMBA_CONFIGS, load_hf_jamba, write_hf_jamba

from turnout.engine.model import (
    ModelConfig,
    ModelConfigError,
    WeightLoadError,
    kv_cache_spec,
    load_model,
    write_random_weights,
)
from turnout.engine.model.jamba import JambaForCausalLM
from turnout.engine.model.moe import SparseMoeBlock
from turnout.engine.model.state_cache import HybridCacheSpec, MambaState

transformers = pytest.importorskip("transformers")

VOCAB = 160


def _seqs(lengths: dict[str, int], seed: int = 7) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randint(3, VOCAB, (n,), generator=gen).tolist() for k, n in lengths.items()}


def _hf_logits(hf: Any, tokens: list[int]) -> torch.Tensor:  # [len, vocab] float32
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def test_jamba_v01_config_and_cache_layout() -> None:
    c = ModelConfig.from_hf_dict(JAMBA_V01)
    assert c.architecture == "JambaForCausalLM" and c.model_type == "jamba" and c.has_inner_state
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size) == (
        32,
        8,
        128,
        14336,
    )
    m, moe = c.mamba, c.moe
    assert m is not None and moe is not None
    assert (m.d_inner, m.d_state, m.d_conv, m.dt_rank, m.inner_layernorms, m.residual_in_fp32) == (
        8192,
        16,
        4,
        256,
        True,
        False,
    )
    assert m.layer_kinds(32) == tuple("attention" if i % 8 == 4 else "mamba" for i in range(32))
    assert (moe.family, moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (
        "jamba",
        16,
        2,
        14336,
    )
    assert (
        not moe.renormalize and moe.routing_scale == 1.0
    )  # JambaTopKRouter: top-k of the softmax as is
    assert [i for i in range(32) if moe.is_moe_layer(i)] == list(range(1, 32, 2))
    assert not c.tie_word_embeddings and c.rms_norm_eps == 1e-6
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    spec = kv_cache_spec(c)
    assert isinstance(spec, HybridCacheSpec) and spec.num_attention_layers == 4
    assert (spec.attention.num_layers, spec.attention.num_kv_heads, spec.attention.head_dim) == (
        4,
        8,
        128,
    )
    # KV blocks over the 4 attention layers only; the state over the 28 Mamba layers
    assert spec.bytes_per_block(16, torch.bfloat16) == 2 * 8 * 128 * 16 * 4 * 2
    assert spec.state_bytes_per_slot(torch.bfloat16) == 28 * (8192 * 3 * 2 + 8192 * 16 * 4)
    total = sum(torch.Size(s).numel() for s in JambaForCausalLM.hf_weight_shapes(c).values())
    assert round(total / 1e9, 2) == 51.57  # Jamba-v0.1's 51.6B parameters (12B active)


def test_dense_variant_has_no_moe_and_tied_embeddings() -> None:
    c = ModelConfig.from_hf_dict(TINY_JAMBA_CONFIGS["jamba-dense-variant"])
    assert c.moe is None and c.tie_word_embeddings and c.num_key_value_heads == 4
    assert c.mamba is not None and c.mamba.layer_kinds(3) == ("mamba", "mamba", "attention")
    assert (c.mamba.dt_rank, c.mamba.d_conv, c.mamba.proj_bias, c.mamba.conv_bias) == (
        6,
        3,
        True,
        False,
    )
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"sliding_window": 4096},
            "sliding_window=4096: Jamba's attention layers attend to the whole",
        ),
        ({"mamba_inner_layernorms": False}, "mamba_inner_layernorms must be true"),
        (
            {"expert_layer_offset": 2},
            r"expert_layer_offset \(2\) must be smaller than expert_layer_period \(2\)",
        ),
        (
            {"attn_layer_offset": 8},
            r"attn_layer_offset \(8\) must be in \[0, attn_layer_period=8\)",
        ),
        ({"num_key_value_heads": 5}, r"must be a multiple of num_key_value_heads \(5\)"),
        ({"num_local_experts": 8}, r"`num_experts` \(16\) and `num_local_experts` \(8\) disagree"),
        ({"num_experts_per_tok": 17}, r"num_experts_per_tok \(17\) exceeds the 16 experts"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"mamba_d_state": 0}, "`mamba_d_state` must be a positive integer"),
        (
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
            "FP8 weights are not supported for models with Mamba layers",
        ),
    ],
)
def test_bad_jamba_configs_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf_dict({**JAMBA_V01, **change})


@pytest.fixture(scope="module", params=sorted(TINY_JAMBA_CONFIGS))
def jamba_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    name = request.param
    return name, write_hf_jamba(TINY_JAMBA_CONFIGS[name], tmp_path_factory.mktemp(name), seed=5)


def test_tensor_names_and_shapes_equal_what_transformers_saves(jamba_dir: tuple[str, Path]) -> None:
    from safetensors import safe_open

    name, path = jamba_dir
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    config = ModelConfig.from_hf_dict(TINY_JAMBA_CONFIGS[name])
    assert JambaForCausalLM.hf_weight_shapes(config) == saved
    if name == "jamba":  # transformers 5 writes the experts one by one (its conversion_mapping)
        assert saved["model.layers.1.feed_forward.experts.3.gate_proj.weight"] == (96, 64)


def test_logits_through_chunks_decodes_and_state_slots_equal_hf(
    jamba_dir: tuple[str, Path],
) -> None:
    _, path = jamba_dir
    hf, ours = load_hf_jamba(path), load_model(path)
    assert isinstance(ours, JambaForCausalLM)
    seqs = _seqs({"a": 12, "b": 25, "c": 7})
    # step 1: chunks of the three prompts (c's first token alone); step 2: the rest but 3;
    # then three one-token steps (the decode path of the conv and the scan)
    got = run_paged_forced(
        ours, seqs, block_size=4, first_chunk={"a": 5, "b": 9, "c": 1}, num_decode=3
    )
    for k, seq in seqs.items():
        torch.testing.assert_close(got[k], _hf_logits(hf, seq), atol=1e-4, rtol=0)


def test_greedy_continuations_equal_hf_generate(jamba_dir: tuple[str, Path]) -> None:
    _, path = jamba_dir
    hf, ours = load_hf_jamba(path), load_model(path)
    prompts = _seqs({"a": 5, "b": 13, "c": 22}, seed=3)
    got, _ = run_paged_greedy(
        ours, prompts, block_size=4, first_chunk={"a": 5, "b": 7, "c": 9}, num_new_tokens=8
    )
    for k, prompt in prompts.items():
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[
                0
            ].tolist()
        assert got[k] == want, f"{k}: greedy tokens differ from HF generate"


def test_a_reused_state_slot_carries_nothing_over(jamba_dir: tuple[str, Path]) -> None:
    _, path = jamba_dir
    hf, ours = load_hf_jamba(path), load_model(path)
    seqs = _seqs({"a": 11, "b": 9}, seed=4)
    session = PagedSession(ours, num_blocks=32, block_size=4)
    session.add("a", seqs["a"])
    session.step({"a": 11})  # a's state is left in its slot
    session.add("b", seqs["b"])
    session.seqs["b"].state_slot = session.seqs[
        "a"
    ].state_slot  # b starts at position 0 in a's slot
    got = torch.cat([session.step({"b": 4})["b"], session.step({"b": 5})["b"]])
    torch.testing.assert_close(got, _hf_logits(hf, seqs["b"]), atol=1e-4, rtol=0)


def test_feed_forwards_follow_the_expert_period() -> None:
    with torch.device("meta"):
        model = JambaForCausalLM(ModelConfig.from_hf_dict(TINY_JAMBA_CONFIGS["jamba"]))
    layers = model.model.layers
    assert [layer.is_attention for layer in layers] == [i % 4 == 1 for i in range(8)]
    assert [isinstance(layer.feed_forward, SparseMoeBlock) for layer in layers] == [
        i % 2 == 1 for i in range(8)
    ]


def test_random_weights_load_here_and_in_transformers(tmp_path: Path) -> None:
    cfg = TINY_JAMBA_CONFIGS["jamba"]
    write_random_weights(cfg, tmp_path, dtype=torch.float32, seed=3)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path,
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    from_dir = load_model(tmp_path)
    drawn = load_model(ModelConfig.from_hf_dict(cfg), seed=3)
    seq = _seqs({"x": 14}, seed=9)
    got = {
        name: run_paged_forced(m, seq, block_size=4, first_chunk={"x": 6}, num_decode=2)["x"]
        for name, m in (("dir", from_dir), ("drawn", drawn))
    }
    torch.testing.assert_close(got["dir"], got["drawn"], atol=0, rtol=0)
    torch.testing.assert_close(got["dir"], _hf_logits(hf.eval(), seq["x"]), atol=1e-4, rtol=0)


def test_a_missing_expert_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = write_random_weights(TINY_JAMBA_CONFIGS["jamba"], tmp_path / "full", dtype=torch.float32)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.3.feed_forward.experts.2.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(
        WeightLoadError,
        match=r"lacks 1 tensors: model\.layers\.3\.feed_forward\.experts\.2\.up_proj",
    ):
        load_model(tmp_path)


def test_caches_of_the_wrong_kind_are_refused() -> None:
    model = load_model(ModelConfig.from_hf_dict(TINY_JAMBA_CONFIGS["jamba-dense-variant"]), seed=1)
    session = PagedSession(model, num_blocks=8, block_size=4)
    caches = list(session.kv_caches)
    assert [type(c) for c in caches] == [MambaState, MambaState, torch.Tensor]
    session.kv_caches = caches[::-1]
    session.add("a", [5, 6, 7])
    with pytest.raises(
        ValueError, match="layer 0 is a Mamba layer: its cache must be a MambaState, got Tensor"
    ):
        session.step({"a": 3})
    session.kv_caches = caches[:2]
    session.add("b", [5, 6, 7])
    with pytest.raises(ValueError, match=r"expected 3 caches \(one per layer\), got 2"):
        session.step({"b": 3})


def test_triton_kernels_equal_the_torch_path() -> None:
    # Through TRITON_INTERPRET=1 on CPU (the kernels themselves on a GPU): paged attention, the
    # Mamba conv1d and scan (prefill chunks, then decode updates) and the fused MoE experts.
    config = ModelConfig.from_hf_dict(TINY_JAMBA_CONFIGS["jamba"])
    seqs = _seqs({"a": 11, "b": 6}, seed=2)
    out = {
        backend: run_paged_forced(
            load_model(config, seed=4, attn_backend=backend),
            seqs,
            block_size=4,
            first_chunk={"a": 5, "b": 2},
            num_decode=2,
        )
        for backend in ("triton", "torch")
    }
    for k in seqs:
        torch.testing.assert_close(out["triton"][k], out["torch"][k], atol=1e-4, rtol=1e-4)
