"""OPTForCausalLM: its config from the real opt-125m config.json, tensor names and shapes equal
to HF transformers', and our decoder equal to HF on HF's own random weights (fp32, paged KV
path with chunked prefill and block_size 4): pre-LN (opt-125m), post-LN (opt-350m), and the
project_in/project_out variants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from paged_session import run_paged_greedy
from tiny_opt_configs import OPT_125M, TINY_OPT_CONFIGS, write_hf_opt

from turnout.engine.model import ModelConfig, ModelConfigError, load_model, write_random_weights
from turnout.engine.model.opt import OPTDecoderModel, opt_weight_shapes

transformers = pytest.importorskip("transformers")

PROMPT_LENS = {"a": 5, "b": 13, "c": 22}
FIRST_CHUNK = {"a": 5, "b": 7, "c": 9}
NUM_NEW_TOKENS = 8


def test_opt_125m_config() -> None:
    c = ModelConfig.from_hf_dict(OPT_125M)
    assert c.opt is not None and c.architecture == "OPTForCausalLM" and c.model_type == "opt"
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        768,
        12,
        12,
        64,
    )
    assert (c.intermediate_size, c.hidden_act, c.layer_norm_eps, c.vocab_size) == (
        3072,
        "relu",
        1e-5,
        50272,
    )
    assert c.tie_word_embeddings and c.attention_bias and c.mlp_bias
    assert (
        c.opt.do_layer_norm_before
        and c.opt.has_final_layer_norm
        and c.opt.word_embed_proj_dim == 768
    )
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (2, 2, 1)
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    post = ModelConfig.from_hf_dict(TINY_OPT_CONFIGS["opt-post-ln-project"])
    assert (
        post.opt is not None
        and not post.opt.has_final_layer_norm
        and post.opt.word_embed_proj_dim == 32
    )
    assert ModelConfig.from_hf_dict(post.to_hf_dict()) == post


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"activation_function": "gelu"}, "activation_function 'gelu'"),
        ({"hidden_size": 770}, "multiple of num_attention_heads"),
        ({"ffn_dim": None}, "ffn_dim"),
    ],
)
def test_bad_opt_configs_are_named(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict({**OPT_125M, **change})


@pytest.mark.parametrize("name", sorted(TINY_OPT_CONFIGS))
def test_tensor_names_and_shapes_equal_hf(name: str) -> None:
    cfg = TINY_OPT_CONFIGS[name]
    hf = transformers.OPTForCausalLM(transformers.OPTConfig(**cfg))
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert opt_weight_shapes(ModelConfig.from_hf_dict(cfg)) == want


@pytest.fixture(scope="module", params=sorted(TINY_OPT_CONFIGS))
def opt_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    path = write_hf_opt(
        TINY_OPT_CONFIGS[request.param], tmp_path_factory.mktemp(request.param), seed=5
    )
    return request.param, path


def _hf(path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.generation_config.eos_token_id = None  # fixed-length greedy continuations
    model.generation_config.pad_token_id = 0
    return model


def _prompts(vocab_size: int) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(7)
    return {
        k: torch.randint(3, vocab_size, (n,), generator=gen).tolist()
        for k, n in PROMPT_LENS.items()
    }


def test_logprobs_and_greedy_tokens_match_hf(opt_dir: tuple[str, Path]) -> None:
    name, path = opt_dir
    ours = load_model(path)
    assert isinstance(ours, OPTDecoderModel)
    hf = _hf(path)
    prompts = _prompts(ours.config.vocab_size)
    sequences, logits = run_paged_greedy(
        ours, prompts, block_size=4, first_chunk=FIRST_CHUNK, num_new_tokens=NUM_NEW_TOKENS
    )
    for k, prompt in prompts.items():
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS, do_sample=False
            )[0].tolist()
            ref = hf(torch.tensor([sequences[k][:-1]])).logits[0]
        assert sequences[k] == want, f"{name}/{k}: greedy tokens differ from HF generate"
        err = (logits[k].log_softmax(-1) - ref.log_softmax(-1)).abs().max().item()
        assert err <= 1e-4, f"{name}/{k}: logprobs differ by {err}"


def test_hub_names_without_model_prefix_load(opt_dir: tuple[str, Path], tmp_path: Path) -> None:
    # facebook/opt-* checkpoints name their tensors decoder.* (no "model." prefix).
    from safetensors.torch import load_file, save_file

    _, path = opt_dir
    tensors = load_file(str(path / "model.safetensors"))
    save_file(
        {k.removeprefix("model."): v for k, v in tensors.items()},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    a, b = load_model(path), load_model(tmp_path)
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_random_weights_load_in_hf_and_equal_the_config_draw(tmp_path: Path) -> None:
    cfg = TINY_OPT_CONFIGS["opt-post-ln-project"]
    write_random_weights(cfg, tmp_path, dtype=torch.float32, seed=2)
    hf = _hf(tmp_path)  # loads without missing or unexpected tensors
    from_dir, drawn = load_model(tmp_path), load_model(ModelConfig.from_hf_dict(cfg), seed=2)
    assert all(
        torch.equal(x, y)
        for x, y in zip(from_dir.state_dict().values(), drawn.state_dict().values(), strict=True)
    )
    prompt = _prompts(cfg["vocab_size"])["b"]
    _, logits = run_paged_greedy(
        from_dir, {"b": prompt}, block_size=4, first_chunk={"b": 13}, num_new_tokens=1
    )
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(
        logits["b"][: len(prompt)].log_softmax(-1), ref.log_softmax(-1), atol=1e-4, rtol=0
    )
