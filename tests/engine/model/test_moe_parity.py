"""The MoE decoders (Qwen2-MoE, Qwen3-MoE, GraniteMoe) equal HF transformers on checkpoints
that transformers itself wrote from configs shrunk from the real ones (fp32): logprobs within
1e-4 through chunked prefill + decode over paged caches (block_size 4), greedy tokens equal
HF's argmaxes; the fused-kernel path equals the reference path; ``write_random_weights`` and
``load_model(ModelConfig)`` cover the families; bad expert tensors are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_moe import hf_model_sharing, hf_moe_dir, load_hf_reference
from paged_session import run_paged_greedy
from safetensors.torch import load_file, save_file
from tiny_model_configs import TINY_MOE_CONFIGS

from turnout.engine.model import (
    DecoderModel,
    ModelConfig,
    SparseMoeBlock,
    WeightLoadError,
    load_model,
    write_random_weights,
)

transformers = pytest.importorskip("transformers")
NUM_NEW_TOKENS = 8
PROMPT_LENS = {"a": 5, "b": 13, "c": 22}
FIRST_CHUNK = {"a": 5, "b": 7, "c": 9}


def _prompts(vocab_size: int, lens: dict[str, int] = PROMPT_LENS) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(7)
    return {k: torch.randint(3, vocab_size, (n,), generator=gen).tolist() for k, n in lens.items()}


@pytest.fixture(scope="module", params=sorted(TINY_MOE_CONFIGS))
def hf_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    return request.param, hf_moe_dir(tmp_path_factory, request.param)


def test_logprobs_and_greedy_tokens_match_hf(hf_dir: tuple[str, Path]) -> None:
    name, path = hf_dir
    ours = load_model(path)
    assert isinstance(ours, DecoderModel)
    hf = load_hf_reference(path)
    prompts = _prompts(ours.config.vocab_size)
    sequences, logits = run_paged_greedy(
        ours, prompts, block_size=4, first_chunk=FIRST_CHUNK, num_new_tokens=NUM_NEW_TOKENS
    )
    for k, prompt in prompts.items():
        with torch.no_grad():
            ref_logits = hf(torch.tensor([sequences[k][:-1]])).logits[0]
        # Greedy decoding is the argmax at each position given the prefix: HF's argmaxes over
        # our sequence equal our tokens exactly when HF generate would produce them.
        want = ref_logits[len(prompt) - 1 :].argmax(-1).tolist()
        assert sequences[k][len(prompt) :] == want, f"{name}/{k}: greedy tokens differ from HF"
        err = (logits[k].log_softmax(-1) - ref_logits.log_softmax(-1)).abs().max().item()
        assert err <= 1e-4, f"{name}/{k}: logprobs differ from HF by {err}"


def test_hf_and_ours_hold_the_same_expert_weights(hf_dir: tuple[str, Path]) -> None:
    # Guards the parity test: the stacked experts are transformers' own stacking of the files.
    name, path = hf_dir
    ours = load_model(path)
    assert isinstance(ours, DecoderModel)
    hf_state = load_hf_reference(path).state_dict()
    layout = {
        layer: isinstance(ours.model.layers[layer].mlp, SparseMoeBlock)
        for layer in range(ours.config.num_hidden_layers)
    }
    assert layout == {i: ours.config.moe.is_moe_layer(i) for i in layout}  # type: ignore[union-attr]
    if name == "qwen2-moe":
        assert layout == {0: True, 1: False, 2: True}  # mlp_only_layers [1]
    layer = 0
    block = ours.model.layers[layer].mlp
    assert isinstance(block, SparseMoeBlock)
    hf_moe = f"model.layers.{layer}." + ("block_sparse_moe." if name == "granite-moe" else "mlp.")
    assert torch.equal(hf_state[hf_moe + "experts.gate_up_proj"], block.experts.w13)
    assert torch.equal(hf_state[hf_moe + "experts.down_proj"], block.experts.w2)
    router = hf_moe + ("router.weight" if name == "granite-moe" else "gate.weight")
    assert torch.equal(hf_state[router], block.gate.weight)
    if block.shared_expert is not None:
        gate_up = torch.cat(
            [
                hf_state[hf_moe + "shared_expert.gate_proj.weight"],
                hf_state[hf_moe + "shared_expert.up_proj.weight"],
            ]
        )
        assert torch.equal(gate_up, block.shared_expert.gate_up_proj.weight)


def test_fused_kernel_path_equals_reference_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The Triton kernels (attention and experts) through TRITON_INTERPRET=1 on CPU; Qwen2-MoE
    # has a shared expert and a dense layer between two sparse ones.
    path = hf_moe_dir(tmp_path_factory, "qwen2-moe")
    prompts = _prompts(160, {"a": 5, "b": 11})
    out = {}
    for backend in ("torch", "triton"):
        model = load_model(path, attn_backend=backend)
        assert isinstance(model, DecoderModel) and model.model.layers[0].mlp.backend == backend  # type: ignore[union-attr]
        out[backend] = run_paged_greedy(
            model, prompts, block_size=4, first_chunk={"a": 5, "b": 6}, num_new_tokens=2
        )
    assert out["triton"][0] == out["torch"][0]
    for k in prompts:
        torch.testing.assert_close(out["triton"][1][k], out["torch"][1][k], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(TINY_MOE_CONFIGS))
def test_random_weights_cover_the_moe_families(name: str, tmp_path: Path) -> None:
    cfg = TINY_MOE_CONFIGS[name]
    write_random_weights(cfg, tmp_path, dtype=torch.float32, seed=4)
    from_dir = load_model(tmp_path)
    from_config = load_model(ModelConfig.from_hf_dict(cfg), seed=4)
    for (n1, p1), (n2, p2) in zip(
        from_dir.named_parameters(), from_config.named_parameters(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2), n1
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, output_loading_info=True, experts_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = _prompts(cfg["vocab_size"], {"a": 17})["a"]
    _, logits = run_paged_greedy(
        from_dir, {"a": ids}, block_size=4, first_chunk={"a": 17}, num_new_tokens=1
    )
    with torch.no_grad():
        want = hf.eval()(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits["a"][:17], want, atol=1e-4, rtol=1e-4)


def _rewrite(src: Path, dst: Path, edit: Any) -> Path:
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_bad_expert_tensors_are_named(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    src = hf_moe_dir(tmp_path_factory, "qwen3-moe")
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    missing = _rewrite(src, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(
        WeightLoadError,
        match=r"checkpoint lacks 1 tensors: model\.layers\.1\.mlp\.experts\.5\.up_proj",
    ):
        load_model(missing)

    def shrink(t: dict[str, torch.Tensor]) -> None:
        t[name] = t[name][:-1]

    with pytest.raises(
        WeightLoadError,
        match=r"experts\.5\.up_proj\.weight: checkpoint shape \(31, 64\) != "
        r"\(32, 64\) expected for its part of model\.layers\.1\.mlp\.experts\.w13",
    ):
        load_model(_rewrite(src, tmp_path / "shrunk", shrink))

    def extra_expert(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.mlp.experts.16.down_proj.weight"] = t[
            "model.layers.0.mlp.experts.0.down_proj.weight"
        ].clone()

    with pytest.raises(
        WeightLoadError, match=r"does not use: model\.layers\.0\.mlp\.experts\.16\.down_proj"
    ):
        load_model(_rewrite(src, tmp_path / "extra", extra_expert))


@pytest.mark.parametrize("name", sorted(TINY_MOE_CONFIGS))
def test_a_transformers_model_sharing_our_tensors_equals_its_own_load(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Guards hf_model_sharing, which the GPU tests use to compare a real-size model with
    # transformers without a second copy of its weights.
    path = hf_moe_dir(tmp_path_factory, name)
    ours = load_model(path)
    shared = hf_model_sharing(ours, TINY_MOE_CONFIGS[name])
    assert shared.model.embed_tokens.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([_prompts(160, {"a": 19})["a"]])
    with torch.no_grad():
        # equal up to the summation order of GEMMs over views (offsets) instead of own tensors
        torch.testing.assert_close(
            shared(ids).logits, load_hf_reference(path)(ids).logits, atol=1e-5, rtol=0
        )
