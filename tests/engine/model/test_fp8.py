"""FP8 checkpoints: every accepted ``quantization_config`` parsed, the refused ones named, the
format's own quantisation rule, the loaded layers (float8_e4m3fn weights, float32 scales, the
dequantising reference on CPU, said in the report), and our decoder on an FP8 checkpoint equal
to HF transformers on the dequantised weights (fp32: greedy tokens equal, logprobs <= 1e-4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fp8_formats import FP8_FORMATS, write_fp8_pair
from paged_session import run_paged_greedy
from tiny_model_configs import TINY_DECODER_CONFIGS
from tiny_opt_configs import TINY_OPT_CONFIGS

from turnout.engine.model import (
    ModelConfig,
    ModelConfigError,
    WeightLoadError,
    load_model,
    write_random_weights,
)
from turnout.engine.model.fp8 import (
    FP8_DTYPE,
    Fp8Linear,
    dequantize_fp8,
    fp8_linear,
    fp8_linear_ref,
)
from turnout.engine.model.fp8_checkpoint import quantize_fp8_weight
from turnout.engine.model.fp8_config import Fp8Scheme

transformers = pytest.importorskip("transformers")
LLAMA = TINY_DECODER_CONFIGS["llama"]


def _config(fmt: str | dict[str, Any], base: dict[str, Any] = LLAMA) -> ModelConfig:
    qc = FP8_FORMATS[fmt] if isinstance(fmt, str) else fmt
    return ModelConfig.from_hf_dict({**base, "quantization_config": qc})


def test_accepted_formats_parse() -> None:
    q = {name: _config(name).quantization for name in FP8_FORMATS}
    assert {n: c.method for n, c in q.items()} == {
        "fp8-tensor-dynamic": "fp8",
        "fp8-tensor-static": "fp8",
        "fp8-block": "fp8",
        "ct-channel-dynamic": "compressed-tensors",
        "ct-tensor-static": "compressed-tensors",
        "ct-channel-weight-only": "compressed-tensors",
    }
    assert (
        q["fp8-block"].scale_name == "weight_scale_inv"
        and q["fp8-tensor-static"].scale_name == "weight_scale"
    )
    assert q["fp8-block"].scheme_for("model.layers.0.mlp.up_proj") == Fp8Scheme(
        "block", "dynamic", (32, 32)
    )
    assert q["ct-tensor-static"].scheme_for("model.layers.1.self_attn.k_proj") == Fp8Scheme(
        "tensor", "static"
    )
    assert q["ct-channel-weight-only"].scheme_for("model.layers.1.mlp.down_proj") == Fp8Scheme(
        "channel", "none"
    )
    for c in q.values():
        assert c.scheme_for("lm_head") is None
    c = _config("ct-channel-dynamic")
    assert c.quantization_method == "compressed-tensors"
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


def test_targets_and_ignore_lists() -> None:
    qc = json.loads(json.dumps(FP8_FORMATS["ct-channel-dynamic"]))
    qc["config_groups"]["group_0"]["targets"] = ["re:.*self_attn\\.(q|k|v|o)_proj$"]
    qc["ignore"] = ["lm_head", "re:model\\.layers\\.1\\..*"]
    q = _config(qc).quantization
    assert q.scheme_for("model.layers.0.self_attn.v_proj") is not None
    assert q.scheme_for("model.layers.0.mlp.gate_proj") is None  # not a target
    assert q.scheme_for("model.layers.1.self_attn.v_proj") is None  # ignored
    vllm = _config(
        {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "ignored_layers": ["model.layers.0"],
        }
    )
    assert vllm.quantization.scheme_for("model.layers.0.mlp.up_proj") is None  # a parent module
    assert vllm.quantization.scheme_for("model.layers.1.mlp.up_proj") is not None


def _ct(**change: Any) -> dict[str, Any]:
    qc = json.loads(json.dumps(FP8_FORMATS["ct-channel-dynamic"]))
    group = qc["config_groups"]["group_0"]
    for key, value in change.items():
        part, _, field = key.partition("__")
        if field:
            group[part][field] = value
        elif part in group:
            group[part] = value
        else:
            qc[part] = value
    return qc


@pytest.mark.parametrize(
    ("qc", "match"),
    [
        ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not supported"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e5m2"}, "fmt 'e5m2'"),
        (
            {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
            "supports activation_scheme 'dynamic' only",
        ),
        (
            {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128]},
            "weight_block_size",
        ),
        (
            {"quant_method": "fp8", "activation_scheme": "per_token"},
            "activation_scheme 'per_token'",
        ),
        (_ct(format="pack-quantized"), "format 'pack-quantized'"),
        (_ct(weights__num_bits=4), "only 8-bit float"),
        (_ct(weights__type="int"), "only 8-bit float"),
        (_ct(weights__strategy="group"), "strategy 'group'"),
        (_ct(weights__symmetric=False), "asymmetric"),
        (_ct(kv_cache_scheme={"num_bits": 8, "type": "float"}), "kv_cache_scheme"),
        (_ct(quantization_status="frozen"), "quantization_status 'frozen'"),
        (
            _ct(
                input_activations={
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "token",
                    "dynamic": False,
                }
            ),
            "static activation scales are supported per tensor",
        ),
        (_ct(targets=["Embedding"]), "'Embedding' is not supported"),
        (["fp8"], "must be an object"),
    ],
)
def test_refused_formats_are_named(qc: Any, match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        _config(qc)


def test_fp8_for_an_encoder_is_refused() -> None:
    bert = {
        "architectures": ["BertModel"],
        "vocab_size": 100,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "hidden_act": "gelu",
    }
    with pytest.raises(ModelConfigError, match="decoders only"):
        _config("fp8-tensor-dynamic", bert)


@pytest.mark.parametrize(
    "scheme",
    [
        Fp8Scheme("tensor", "dynamic"),
        Fp8Scheme("channel", "dynamic"),
        Fp8Scheme("block", "dynamic", (32, 48)),
    ],
)
def test_quantisation_rule(scheme: Fp8Scheme) -> None:
    w = torch.randn(80, 100, generator=torch.Generator().manual_seed(0)) * torch.logspace(
        -2, 1, 100
    )
    q, scale = quantize_fp8_weight(w, scheme)
    assert q.dtype == FP8_DTYPE and scale.dtype == torch.float32
    want_shape = {"tensor": (), "channel": (80, 1), "block": (3, 3)}[scheme.weight_strategy]
    assert tuple(scale.shape) == want_shape
    rows = (
        scale.reshape(-1).expand(80)
        if scheme.weight_strategy == "tensor"
        else (scale.reshape(-1) if scheme.weight_strategy == "channel" else scale)
    )
    deq = dequantize_fp8(q, rows, scheme.weight_block_size)
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself (plus the subnormal step).
    assert ((deq - w).abs() <= w.abs() / 16 + rows.max() * 2**-9).all()
    assert deq.abs().max() <= w.abs().max() * (1 + 1e-6)  # amax maps to 448 exactly
    q2, _ = quantize_fp8_weight(deq, scheme)  # dequantised weights quantise back to themselves
    assert torch.equal(q2.float(), q.float())


def test_reference_linear_and_the_launcher_checks() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(48, 32, generator=gen)
    q, scale = quantize_fp8_weight(w, Fp8Scheme("channel", "dynamic"))
    x, bias = torch.randn(5, 32, generator=gen), torch.randn(48, generator=gen)
    out = fp8_linear_ref(x, q, scale.reshape(-1), bias)
    torch.testing.assert_close(out, x @ (q.float() * scale).T + bias)
    with pytest.raises(ValueError, match="x bfloat16"):
        fp8_linear(x, q, scale.reshape(-1))
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8_linear(x[:, :30].bfloat16(), q[:, :30].contiguous(), scale.reshape(-1))


@pytest.fixture(scope="module")
def fp8_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Path, Path]]:
    cases = [("llama", f) for f in FP8_FORMATS] + [
        ("qwen3", "ct-channel-dynamic"),
        ("qwen3", "fp8-block"),
    ]
    return {
        (arch, fmt): write_fp8_pair(
            TINY_DECODER_CONFIGS[arch], fmt, tmp_path_factory.mktemp(f"{arch}-{fmt}")
        )
        for arch, fmt in cases
    }


def test_loaded_layers_hold_fp8_and_say_how_they_run(fp8_dirs: dict) -> None:
    model = load_model(fp8_dirs["llama", "ct-tensor-static"][0])
    layers = {n: m for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert len(layers) == 8 and isinstance(model.lm_head, torch.nn.Linear)  # lm_head ignored
    qkv = layers["model.layers.0.self_attn.qkv_proj"]
    assert qkv.weight.dtype == FP8_DTYPE and qkv.weight.shape == (128, 64)
    assert qkv.weight_scale.dtype == torch.float32 and qkv.weight_scale.shape == (128,)
    assert qkv.input_scale.shape == () and qkv.execution == "reference"
    # The per-tensor scales of q, k and v each cover their own rows of the fused projection.
    assert (
        len(set(qkv.weight_scale[:64].tolist())) == 1
        and qkv.weight_scale[63] != qkv.weight_scale[64]
    )
    report = model.quantization_report
    assert report.method == "compressed-tensors"
    assert str(report) == (
        "weights: compressed-tensors (per-tensor weight scales, static per-tensor "
        "input scales; 8 of 9 linear layers FP8): 8 layers: float8_e4m3fn weights "
        "dequantised to float32 per matmul (cpu: no FP8 matmul)"
    )


def _hf(path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _check_parity(fp8_dir: Path, dense_dir: Path, vocab: int) -> None:
    ours, hf = load_model(fp8_dir), _hf(dense_dir)
    gen = torch.Generator().manual_seed(7)
    prompts = {
        k: torch.randint(3, vocab, (n,), generator=gen).tolist()
        for k, n in {"a": 5, "b": 13, "c": 22}.items()
    }
    sequences, logits = run_paged_greedy(
        ours, prompts, block_size=4, first_chunk={"a": 5, "b": 7, "c": 9}, num_new_tokens=8
    )
    for k, prompt in prompts.items():
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[
                0
            ].tolist()
            ref = hf(torch.tensor([sequences[k][:-1]])).logits[0]
        assert sequences[k] == want, (
            f"{fp8_dir.name}/{k}: greedy tokens differ from HF on the dequantised weights"
        )
        err = (logits[k].log_softmax(-1) - ref.log_softmax(-1)).abs().max().item()
        assert err <= 1e-4, f"{fp8_dir.name}/{k}: {err}"


@pytest.mark.parametrize(
    "case",
    [("llama", f) for f in FP8_FORMATS] + [("qwen3", "ct-channel-dynamic"), ("qwen3", "fp8-block")],
    ids=str,
)
def test_greedy_tokens_and_logprobs_equal_hf_on_the_dequantised_weights(
    case: tuple[str, str], fp8_dirs: dict
) -> None:
    fp8_dir, dense_dir = fp8_dirs[case]
    _check_parity(fp8_dir, dense_dir, TINY_DECODER_CONFIGS[case[0]]["vocab_size"])


def test_opt_fp8(tmp_path: Path) -> None:
    # Every OPT linear (q/k/v/out, fc1/fc2, project_in/out) is a target of "Linear".
    cfg = {**TINY_OPT_CONFIGS["opt-post-ln-project"], "init_std": 0.3}
    fp8_dir, dense_dir = write_fp8_pair(cfg, "ct-channel-dynamic", tmp_path)
    assert sum(isinstance(m, Fp8Linear) for m in load_model(fp8_dir).modules()) == 2 * 4 + 2
    _check_parity(fp8_dir, dense_dir, cfg["vocab_size"])


def test_bad_fp8_checkpoints_are_named(fp8_dirs: dict, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = fp8_dirs["llama", "ct-channel-dynamic"][0]
    tensors = load_file(str(src / "model.safetensors"))
    cases = {
        "missing-scale": (
            {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight_scale"},
            "FP8 checkpoint lacks model.layers.1.mlp.up_proj.weight_scale",
        ),
        "dense-weight": (
            {
                **tensors,
                "model.layers.0.self_attn.k_proj.weight": tensors[
                    "model.layers.0.self_attn.k_proj.weight"
                ].float(),
            },
            "k_proj.weight: expected float8_e4m3fn",
        ),
        "scale-shape": (
            {**tensors, "model.layers.0.mlp.down_proj.weight_scale": torch.ones(64, 2)},
            r"per-channel scales are \[64, 1\], got \(64, 2\)",
        ),
        "fp8-lm-head": (
            {**tensors, "lm_head.weight": tensors["lm_head.weight"].to(FP8_DTYPE)},
            "lm_head.weight: an FP8 tensor, but the config",
        ),
    }
    for name, (changed, match) in cases.items():
        out = tmp_path / name
        out.mkdir()
        save_file(changed, str(out / "model.safetensors"))
        (out / "config.json").write_text((src / "config.json").read_text())
        with pytest.raises(WeightLoadError, match=match):
            load_model(out)


def test_random_fp8_weights_equal_the_written_ones(tmp_path: Path) -> None:
    hf_config = {
        **TINY_DECODER_CONFIGS["qwen3"],
        "quantization_config": FP8_FORMATS["fp8-tensor-dynamic"],
    }
    write_random_weights(hf_config, tmp_path, dtype=torch.float32, seed=4)
    a, b = load_model(tmp_path), load_model(ModelConfig.from_hf_dict(hf_config), seed=4)
    assert all(
        torch.equal(x.float(), y.float())
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    with pytest.raises(ValueError, match="static scheme needs its calibration"):
        write_random_weights(
            {**hf_config, "quantization_config": FP8_FORMATS["fp8-tensor-static"]}, tmp_path / "s"
        )
