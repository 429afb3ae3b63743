"""DeepSeek-V2's config: the MLA fields and YaRN scaling read from the real DeepSeek-V2-Lite
config.json (both RoPE spellings), round trips, refusals by name; YaRN frequencies, the cos/sin
scale and the softmax scale equal transformers' own functions; the interleaved-pair rotation
equals transformers' ``apply_rotary_emb``; the latent KV-cache spec."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from deepseek_tiny import TINY_DEEPSEEK_V2, deepseek_v2_lite

from turnout.engine.model import (
    MLAAttentionSpec,
    ModelConfig,
    ModelConfigError,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    kv_cache_spec,
)
from turnout.engine.model.deepseek_rope import DeepseekRotaryEmbedding, yarn_inv_freq

transformers = pytest.importorskip("transformers")


def test_deepseek_v2_lite_config_is_read() -> None:
    c = ModelConfig.from_hf_dict(deepseek_v2_lite())
    assert (c.architecture, c.model_type, c.num_hidden_layers, c.num_attention_heads) == (
        "DeepseekV2ForCausalLM",
        "deepseek_v2",
        27,
        16,
    )
    assert c.mla is not None and c.rope_scaling is None and c.rope_theta == 10000.0
    assert (
        c.mla.q_lora_rank,
        c.mla.kv_lora_rank,
        c.mla.qk_nope_head_dim,
        c.mla.qk_rope_head_dim,
        c.mla.v_head_dim,
        c.mla.latent_dim,
    ) == (None, 512, 128, 64, 128, 576)
    assert c.head_dim == 64  # qk_rope_head_dim, as transformers' DeepseekV2Config sets it
    yarn = c.mla.rope_scaling
    assert yarn is not None and (yarn.factor, yarn.original_max_position_embeddings) == (40.0, 4096)
    assert yarn.cos_sin_scale == 1.0  # mscale == mscale_all_dim
    mscale = 0.1 * 0.707 * math.log(40) + 1
    assert c.mla.softmax_scale == pytest.approx(192**-0.5 * mscale**2, rel=1e-12)


def test_round_trip_and_transformers_5_spelling() -> None:
    c = ModelConfig.from_hf_dict(deepseek_v2_lite())
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    d = deepseek_v2_lite()
    d["rope_parameters"] = {**d.pop("rope_scaling"), "rope_theta": d.pop("rope_theta")}
    assert ModelConfig.from_hf_dict(d) == c
    q_lora = ModelConfig.from_hf_dict(TINY_DEEPSEEK_V2["q-lora"])
    assert q_lora.mla is not None and q_lora.mla.q_lora_rank == 48
    assert ModelConfig.from_hf_dict(q_lora.to_hf_dict()) == q_lora


def test_transformers_reads_our_round_trip_alike() -> None:
    c = ModelConfig.from_hf_dict(deepseek_v2_lite())
    fields = {k: v for k, v in c.to_hf_dict().items() if k != "architectures"}
    hf = transformers.AutoConfig.for_model(**fields)
    assert (hf.kv_lora_rank, hf.q_lora_rank, hf.qk_head_dim, hf.rope_parameters["factor"]) == (
        512,
        None,
        192,
        40.0,
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"kv_lora_rank": None}, "`kv_lora_rank` must be a positive integer"),
        ({"q_lora_rank": 0}, "`q_lora_rank` must be a positive integer"),
        ({"qk_rope_head_dim": 7}, "qk_rope_head_dim must be even"),
        (
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "'dynamic' is not implemented for DeepseekV2",
        ),
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "original_max_position_embeddings"),
        ({"sliding_window": 4096}, "sliding_window is not supported"),
        (
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
            "quantization_config is not supported for DeepseekV2ForCausalLM",
        ),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_bad_configs_are_named(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict({**deepseek_v2_lite(), **change})


def _hf_config(d: dict[str, Any]) -> Any:
    return transformers.AutoConfig.for_model(**{k: v for k, v in d.items() if k != "architectures"})


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
        {
            "type": "yarn",
            "factor": 8,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "beta_fast": 16,
        },
        {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64},  # no mscales
    ],
)
def test_yarn_tables_equal_transformers(scaling: dict[str, Any] | None) -> None:
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_ds

    d = {**deepseek_v2_lite(), "rope_scaling": scaling}
    ours = ModelConfig.from_hf_dict(d)
    assert ours.mla is not None
    hf_rotary = hf_ds.DeepseekV2RotaryEmbedding(_hf_config(d))
    want = hf_rotary.inv_freq
    got = yarn_inv_freq(64, ours.rope_theta, ours.mla.rope_scaling)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    yarn = ours.mla.rope_scaling
    assert (yarn.cos_sin_scale if yarn else 1.0) == pytest.approx(
        hf_rotary.attention_scaling, rel=1e-12
    )
    hf_scale = hf_ds.yarn_apply_mscale(_hf_config(d).rope_parameters, 192**-0.5)
    assert ours.mla.softmax_scale == pytest.approx(hf_scale, rel=1e-12)


def test_rotation_of_interleaved_pairs_equals_transformers() -> None:
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_ds

    d = TINY_DEEPSEEK_V2["q-lora"]
    c = ModelConfig.from_hf_dict(d)
    assert c.mla is not None
    rotary = DeepseekRotaryEmbedding(8, c.rope_theta, c.mla.rope_scaling, 2048)
    hf_rotary = hf_ds.DeepseekV2RotaryEmbedding(_hf_config(d))
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 300, 2047])
    q_pe, k_pe = torch.randn(5, 4, 8, generator=gen), torch.randn(5, 8, generator=gen)
    got_q, got_k = rotary(positions, q_pe, k_pe)
    freqs_cis = hf_rotary(q_pe, positions[None])  # [1, T, rope / 2] complex
    want_q, want_k = hf_ds.apply_rotary_emb(q_pe.transpose(0, 1)[None], k_pe[None, None], freqs_cis)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_k, want_k[0, 0], atol=1e-6, rtol=1e-6)


def test_latent_cache_is_sized_from_the_latent_width() -> None:
    c = ModelConfig.from_hf_dict(deepseek_v2_lite())
    spec = kv_cache_spec(c)
    assert spec == MLAAttentionSpec(num_layers=27, kv_lora_rank=512, qk_rope_head_dim=64)
    # 576 values per token and layer, not 2 x 16 heads x 192 (or 128) as full attention would
    assert kv_cache_bytes_per_block(c, 16, torch.bfloat16) == 576 * 16 * 27 * 2
    tiny = ModelConfig.from_hf_dict(TINY_DEEPSEEK_V2["lite"])
    caches = allocate_kv_caches(tiny, 5, 4, torch.float32, "cpu")
    assert len(caches) == 3 and all(t.shape == (5, 4, 40) for t in caches)
