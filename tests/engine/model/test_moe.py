"""The MoE block (engine/model/moe.py): MoEConfig from each family's HF keys, the routing
function, and SparseMoeBlock against transformers' own MoE modules on the same random weights
(Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock, GraniteMoeMoE, DeepseekV2Moe,
JambaSparseMoeBlock), fp32."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from turnout.engine.model import ModelConfigError, MoEConfig, SparseMoeBlock, select_experts

transformers = pytest.importorskip("transformers")
CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"
QWEN2, QWEN3, GRANITE, DEEPSEEK, JAMBA = (
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "GraniteMoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "JambaForCausalLM",
)


def real(name: str) -> dict[str, Any]:
    return dict(json.loads((CONFIGS / f"{name}.json").read_text())["config"])


def moe_of(arch: str, d: dict[str, Any], num_layers: int = 4) -> MoEConfig:
    return MoEConfig.from_hf_dict(d, architecture=arch, num_hidden_layers=num_layers)


# ---- MoEConfig ------------------------------------------------------------------------------


def test_the_real_configs() -> None:
    qwen2 = moe_of(QWEN2, real("qwen1.5-moe-a2.7b"), 24)
    assert (qwen2.num_experts, qwen2.num_experts_per_tok, qwen2.moe_intermediate_size) == (
        60,
        4,
        1408,
    )
    assert qwen2.shared_expert_intermediate_size == 5632 and qwen2.shared_expert_gate
    assert not qwen2.renormalize and qwen2.routing_scale == 1.0
    qwen3 = moe_of(QWEN3, real("qwen3-30b-a3b"), 48)
    assert (qwen3.num_experts, qwen3.num_experts_per_tok, qwen3.renormalize) == (128, 8, True)
    assert qwen3.shared_expert_intermediate_size == 0 and not qwen3.shared_expert_gate
    granite = moe_of(GRANITE, real("granite-3.0-1b-a400m"), 24)
    assert (granite.num_experts, granite.num_experts_per_tok, granite.moe_intermediate_size) == (
        32,
        8,
        512,
    )
    assert granite.renormalize  # softmax over the top-k logits
    lite = moe_of(DEEPSEEK, real("deepseek-v2-lite"), 27)
    assert (lite.num_experts, lite.num_experts_per_tok, lite.n_shared_experts) == (64, 6, 2)
    assert lite.shared_expert_intermediate_size == 2 * 1408 and lite.router_in_float32
    assert [lite.is_moe_layer(i) for i in range(3)] == [
        False,
        True,
        True,
    ]  # first_k_dense_replace 1
    for cfg, layers in ((qwen2, 24), (qwen3, 48), (granite, 24)):
        assert all(cfg.is_moe_layer(i) for i in range(layers))


def test_sparse_layers_follow_step_mlp_only_and_dense_first_layers() -> None:
    base = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8}
    step2 = moe_of(QWEN3, {**base, "decoder_sparse_step": 2, "mlp_only_layers": [3]}, 6)
    assert [step2.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    ds = {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 8,
        "first_k_dense_replace": 2,
        "moe_layer_freq": 2,
    }
    deepseek = moe_of(DEEPSEEK, ds, 7)
    assert [deepseek.is_moe_layer(i) for i in range(7)] == [
        False,
        False,
        True,
        False,
        True,
        False,
        True,
    ]


def test_aliases_of_transformers_5_are_read() -> None:
    base = {"num_experts_per_tok": 2, "moe_intermediate_size": 8}
    assert (
        moe_of(QWEN3, {**base, "num_local_experts": 6}).num_experts == 6
    )  # as transformers 5 writes it
    assert moe_of(DEEPSEEK, {**base, "num_experts": 6}).num_experts == 6
    with pytest.raises(
        ModelConfigError, match=r"`num_experts` .* and `num_local_experts` .* disagree"
    ):
        moe_of(QWEN3, {**base, "num_experts": 6, "num_local_experts": 8})


def test_to_hf_dict_round_trips() -> None:
    for arch, name, layers in (
        (QWEN2, "qwen1.5-moe-a2.7b", 24),
        (QWEN3, "qwen3-30b-a3b", 48),
        (GRANITE, "granite-3.0-1b-a400m", 24),
        (DEEPSEEK, "deepseek-v2-lite", 27),
    ):
        cfg = moe_of(arch, real(name), layers)
        hf = {**real(name), **cfg.to_hf_dict()}
        assert moe_of(arch, hf, layers) == cfg


BAD = {  # (architecture, change to a valid config, message)
    "no-experts": (QWEN3, {"num_experts": None}, "`num_experts` is required"),
    "top-k-above-experts": (
        QWEN3,
        {"num_experts_per_tok": 9},
        r"num_experts_per_tok \(9\) exceeds the 8",
    ),
    "mlp-only-outside": (QWEN3, {"mlp_only_layers": [4]}, r"mlp_only_layers \[4\] are not layers"),
    "mlp-only-not-a-list": (QWEN3, {"mlp_only_layers": "1"}, "must be a list of layer indices"),
    "zero-step": (QWEN3, {"decoder_sparse_step": 0}, "`decoder_sparse_step` must be a positive"),
    "no-shared-width": (QWEN2, {}, "`shared_expert_intermediate_size` is required"),
    "sigmoid-scoring": (
        DEEPSEEK,
        {"scoring_func": "sigmoid"},
        "scoring_func 'sigmoid' is not implemented",
    ),
    "noaux-tc": (
        DEEPSEEK,
        {"topk_method": "noaux_tc"},
        "topk_method 'noaux_tc' is not implemented",
    ),
    "groups-missing": (
        DEEPSEEK,
        {"topk_method": "group_limited_greedy"},
        "needs n_group and topk_group",
    ),
    "groups-uneven": (
        DEEPSEEK,
        {"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1},
        r"n_group \(3\) must divide the 8 experts",
    ),
    "too-few-group-experts": (
        DEEPSEEK,
        {"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 1},
        "exceeds the experts of 1 groups",
    ),
    "scale-not-a-number": (DEEPSEEK, {"routed_scaling_factor": "16"}, "must be a positive number"),
    "shared-bias": (DEEPSEEK, {"mlp_bias": True}, "mlp_bias is not supported"),
    "norm-not-a-flag": (QWEN3, {"norm_topk_prob": "yes"}, "must be true or false"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_moe_configs_are_refused_by_name(case: str) -> None:
    arch, change, message = BAD[case]
    valid = ({"n_routed_experts": 8} if arch == DEEPSEEK else {"num_experts": 8}) | {
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 8,
    }
    with pytest.raises(ModelConfigError, match=message):
        moe_of(arch, {k: v for k, v in {**valid, **change}.items() if v is not None})


# ---- routing --------------------------------------------------------------------------------


def test_select_experts_is_softmax_top_k() -> None:
    logits = torch.randn(7, 10, generator=torch.Generator().manual_seed(0))
    probs = logits.softmax(-1)
    w, ids = select_experts(logits.to(torch.bfloat16), top_k=3, renormalize=False)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.is_contiguous()
    want_w, want_ids = logits.to(torch.bfloat16).float().softmax(-1).topk(3)
    assert torch.equal(ids.long(), want_ids) and torch.equal(w, want_w)
    w, ids = select_experts(logits, top_k=3, renormalize=True, routed_scaling_factor=2.5)
    chosen = probs.gather(1, ids.long())
    torch.testing.assert_close(w, 2.5 * chosen / chosen.sum(-1, keepdim=True))


def test_group_limited_greedy_equals_transformers_router() -> None:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    config = transformers.DeepseekV2Config(
        hidden_size=32,
        n_routed_experts=16,
        num_experts_per_tok=3,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=16.0,
    )
    router = DeepseekV2TopkRouter(config)
    gen = torch.Generator().manual_seed(3)
    router.weight.data = torch.randn(16, 32, generator=gen)
    hidden = torch.randn(50, 32, generator=gen)
    logits, hf_w, hf_ids = router(hidden)
    w, ids = select_experts(
        logits,
        top_k=3,
        renormalize=False,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=16.0,
    )
    order, hf_order = ids.long().sort(-1), hf_ids.sort(-1)  # transformers takes them unsorted
    assert torch.equal(order.values, hf_order.values)
    torch.testing.assert_close(w.gather(1, order.indices), hf_w.gather(1, hf_order.indices))
    groups = (ids.long() // 4).tolist()
    assert all(len(set(g)) <= 2 for g in groups)  # at most topk_group groups per token
    greedy = select_experts(logits, top_k=3, renormalize=False)[1]
    assert not torch.equal(greedy.sort(-1).values, ids.sort(-1).values)  # the limit matters here


def test_select_experts_refuses_by_name() -> None:
    logits = torch.zeros(2, 8)
    for kwargs, message in (
        ({"scoring": "sigmoid"}, "scoring 'sigmoid'"),
        ({"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
        ({"top_k": 9}, r"top_k must be in \[1, 8\]"),
        (
            {"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1},
            "n_group dividing the 8 experts",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            select_experts(logits, **{"top_k": 2, "renormalize": False, **kwargs})  # type: ignore[arg-type]


# ---- SparseMoeBlock vs transformers' modules -------------------------------------------------


def _fill(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5


def _ours_from(hf: torch.nn.Module, moe: MoEConfig, hidden_size: int) -> SparseMoeBlock:
    ours = SparseMoeBlock(hidden_size, moe, backend="torch")
    sd = dict(hf.state_dict())
    experts = next(k for k in sd if k.endswith("experts.gate_up_proj")).removesuffix("gate_up_proj")
    shared = next(
        (
            k.removesuffix("gate_proj.weight")
            for k in sd
            if k.startswith("shared_expert") and k.endswith("gate_proj.weight")
        ),
        None,
    )
    state = {
        "gate.weight": sd.get("gate.weight", sd.get("router.weight")),
        "experts.w13": sd[experts + "gate_up_proj"],
        "experts.w2": sd[experts + "down_proj"],
    }
    if shared is not None:
        state["shared_expert.gate_up_proj.weight"] = torch.cat(
            [sd[shared + "gate_proj.weight"], sd[shared + "up_proj.weight"]]
        )
        state["shared_expert.down_proj.weight"] = sd[shared + "down_proj.weight"]
    if "shared_expert_gate.weight" in sd:
        state["shared_expert_gate.weight"] = sd["shared_expert_gate.weight"]
    ours.load_state_dict(state, strict=True)
    return ours.eval()


_BLOCK_BASE = {
    "hidden_size": 48,
    "moe_intermediate_size": 24,
    "num_experts_per_tok": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}
BLOCKS = {  # name -> (architecture, transformers module path, HF config keys)
    "qwen2-moe-shared-gated": (
        QWEN2,
        "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
        {**_BLOCK_BASE, "num_experts": 10, "shared_expert_intermediate_size": 40},
    ),
    "qwen3-moe-renormalised": (
        QWEN3,
        "qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
        {**_BLOCK_BASE, "num_experts": 12, "norm_topk_prob": True},
    ),
    "granite-moe": (
        GRANITE,
        "granitemoe.modeling_granitemoe.GraniteMoeMoE",
        {
            "hidden_size": 48,
            "intermediate_size": 24,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
        },
    ),
    "deepseek-v2-lite-greedy": (
        DEEPSEEK,
        "deepseek_v2.modeling_deepseek_v2.DeepseekV2Moe",
        {
            **_BLOCK_BASE,
            "n_routed_experts": 16,
            "n_shared_experts": 2,
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
        },
    ),
    "deepseek-v2-group-limited-scaled": (
        DEEPSEEK,
        "deepseek_v2.modeling_deepseek_v2.DeepseekV2Moe",
        {
            **_BLOCK_BASE,
            "n_routed_experts": 16,
            "n_shared_experts": 1,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 16.0,
        },
    ),
    "jamba-unnormalised": (
        JAMBA,
        "jamba.modeling_jamba.JambaSparseMoeBlock",
        {
            "hidden_size": 48,
            "intermediate_size": 24,
            "num_experts": 8,
            "num_experts_per_tok": 3,
            "expert_layer_period": 1,
            "expert_layer_offset": 0,
        },
    ),
}


def _hf_block(module_path: str, arch: str, keys: dict[str, Any]) -> torch.nn.Module:
    import importlib

    module_name, _, cls_name = module_path.rpartition(".")
    cls = getattr(importlib.import_module(f"transformers.models.{module_name}"), cls_name)
    config_cls = {
        QWEN2: transformers.Qwen2MoeConfig,
        QWEN3: transformers.Qwen3MoeConfig,
        GRANITE: transformers.GraniteMoeConfig,
        DEEPSEEK: transformers.DeepseekV2Config,
        JAMBA: transformers.JambaConfig,
    }[arch]
    config = config_cls(**keys)
    config._experts_implementation = "eager"  # the plain per-expert loop
    return cls(config).eval()


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_block_equals_transformers_module(name: str) -> None:
    arch, module_path, keys = BLOCKS[name]
    hf = _hf_block(module_path, arch, keys)
    _fill(hf, seed=5)
    ours = _ours_from(hf, moe_of(arch, keys), keys["hidden_size"])
    x = torch.randn(1, 37, keys["hidden_size"], generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf(x)[0]
        got = ours(x[0])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_deepseek_norm_topk_prob_follows_deepseeks_gate() -> None:
    # transformers 5 drops norm_topk_prob for DeepSeek-V2 (its router deletes it); DeepSeek's
    # modeling_deepseek.py renormalises (top_k > 1) and then leaves routed_scaling_factor out.
    keys = {
        **_BLOCK_BASE,
        "n_routed_experts": 16,
        "n_shared_experts": 0,
        "norm_topk_prob": True,
        "routed_scaling_factor": 16.0,
    }
    moe = moe_of(DEEPSEEK, keys)
    assert moe.renormalize and moe.routing_scale == 1.0
    block = SparseMoeBlock(48, moe, backend="torch")
    _fill(block, seed=7)
    x = torch.randn(9, 48, generator=torch.Generator().manual_seed(8))
    scores = (x @ block.gate.weight.T).softmax(-1)
    top_w, top_i = scores.topk(3, dim=-1)
    top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20)  # modeling_deepseek.py's denominator
    want = torch.zeros_like(x)
    w13, w2 = block.experts.w13, block.experts.w2
    for t in range(9):
        for w, e in zip(top_w[t], top_i[t].tolist(), strict=True):
            gate, up = (w13[e] @ x[t]).chunk(2)
            want[t] += w * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    with torch.no_grad():
        torch.testing.assert_close(block(x), want, atol=1e-5, rtol=1e-5)
    top1 = moe_of(DEEPSEEK, {**keys, "num_experts_per_tok": 1})
    assert not top1.renormalize and top1.routing_scale == 16.0  # top-1: scaled, as DeepSeek's gate


def test_block_triton_backend_equals_torch_backend() -> None:
    arch, _, keys = BLOCKS["qwen2-moe-shared-gated"]
    block = SparseMoeBlock(48, moe_of(arch, keys), backend="torch")
    _fill(block, seed=9)
    x = torch.randn(13, 48, generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        want = block(x)
        block.backend = "triton"  # on CPU: the kernels through TRITON_INTERPRET=1
        got = block(x)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_block_refuses_an_unknown_backend() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        SparseMoeBlock(
            8,
            moe_of(QWEN3, {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8}),
            backend="cuda",
        )


# ---- ModelConfig of the MoE decoders ---------------------------------------------------------


def test_model_config_of_the_moe_families() -> None:
    from turnout.engine.model import ModelConfig

    qwen2 = ModelConfig.from_hf_dict(real("qwen1.5-moe-a2.7b"))
    assert (qwen2.qkv_bias, qwen2.o_proj_bias, qwen2.has_qk_norm, qwen2.granite) == (
        True,
        False,
        False,
        None,
    )
    assert (
        qwen2.sliding_window is None and qwen2.moe is not None and qwen2.intermediate_size == 5632
    )
    qwen3 = ModelConfig.from_hf_dict(real("qwen3-30b-a3b"))
    assert qwen3.has_qk_norm and qwen3.head_dim == 128 and not qwen3.qkv_bias
    granite = ModelConfig.from_hf_dict(real("granite-3.0-1b-a400m"))
    assert granite.granite is not None and granite.tie_word_embeddings
    assert (
        granite.granite.embedding_multiplier,
        granite.granite.attention_multiplier,
        granite.granite.residual_multiplier,
        granite.granite.logits_scaling,
    ) == (12.0, 0.015625, 0.22, 6.0)
    for config in (qwen2, qwen3, granite):
        assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
        assert hash(config) == hash(ModelConfig.from_hf_dict(config.to_hf_dict()))


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("qwen1.5-moe-a2.7b", {"qkv_bias": False}, "qkv_bias must be true for Qwen2MoeForCausalLM"),
        ("qwen3-30b-a3b", {"mlp_bias": True}, "mlp_bias is not supported for Qwen3MoeForCausalLM"),
        ("qwen3-30b-a3b", {"use_sliding_window": True}, "use_sliding_window=true"),
        (
            "granite-3.0-1b-a400m",
            {"embedding_multiplier": "12"},
            "`embedding_multiplier` must be a positive number",
        ),
        (
            "granite-3.0-1b-a400m",
            {"logits_scaling": 0},
            "`logits_scaling` must be a positive number",
        ),
        (
            "qwen3-30b-a3b",
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
            "FP8 weights are not supported for mixture-of-experts models",
        ),
    ],
)
def test_model_config_refusals(name: str, change: dict[str, Any], message: str) -> None:
    from turnout.engine.model import ModelConfig

    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf_dict({**real(name), **change})
