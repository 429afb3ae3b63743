"""GPU (`gpu` marker): the decoder on CUDA goes through the Triton kernels ("auto" backend).

- Greedy tokens and fp32 logprobs equal HF transformers on CUDA for every tiny config (the
  same chunked-prefill + decode schedule as the CPU parity test).
- At the real Qwen3-0.6B and Llama-3.1-8B-layer shapes (random weights), the Triton path
  equals the torch-reference path on the same weights and tokens (fp32: logprobs within 2e-3;
  bf16: logits rows at cosine >= 0.999, top-1 choices equal except at near ties).
- A decode step captured in a CUDA graph (static input buffers, as runner_v2 does) replays to
  the eager step's logits.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from logit_agreement import assert_logits_agree
from paged_session import (
    check_decode_graph_replay,
    run_paged_forced,
    run_paged_greedy,
)
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import (
    DecoderModel,
    ModelConfig,
    load_model,
    write_random_weights,
)

pytestmark = pytest.mark.gpu
CONFIGS = Path(__file__).resolve().parents[3] / "policies" / "reference" / "model_configs"
PROMPTS = {"a": list(range(3, 8)), "b": list(range(40, 53)), "c": list(range(90, 112))}
FIRST_CHUNK = {"a": 5, "b": 7, "c": 9}


@pytest.mark.parametrize("name", sorted(TINY_DECODER_CONFIGS))
def test_greedy_and_logprobs_match_hf_on_cuda(tmp_path: Path, name: str) -> None:
    transformers = pytest.importorskip("transformers")
    write_random_weights(TINY_DECODER_CONFIGS[name], tmp_path, dtype=torch.float32, seed=3)
    ours = load_model(tmp_path, device="cuda")
    assert isinstance(ours, DecoderModel)
    assert ours.model.layers[0].self_attn.backend == "auto"  # -> Triton on CUDA
    hf = (
        transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, dtype=torch.float32, attn_implementation="eager"
        )
        .cuda()
        .eval()
    )
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    sequences, logits = run_paged_greedy(
        ours, PROMPTS, block_size=4, first_chunk=FIRST_CHUNK, num_new_tokens=8
    )
    for k, prompt in PROMPTS.items():
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt], device="cuda"), max_new_tokens=8, do_sample=False
            )[0].tolist()
            ref = hf(torch.tensor([sequences[k][:-1]], device="cuda")).logits[0].float().cpu()
        assert sequences[k] == want, f"{name}/{k}"
        err = (logits[k].log_softmax(-1) - ref.log_softmax(-1)).abs().max().item()
        assert err <= 1e-4, f"{name}/{k}: {err}"


def _real_config(file: str, num_layers: int) -> ModelConfig:
    hf = json.loads((CONFIGS / file).read_text())["config"]
    return dataclasses.replace(ModelConfig.from_hf_dict(hf), num_hidden_layers=num_layers)


def _set_backend(model: DecoderModel, backend: str) -> None:
    for layer in model.model.layers:
        layer.self_attn.backend = backend


@pytest.mark.parametrize(
    ("file", "num_layers"), [("qwen3-0.6b.json", 28), ("llama-3.1-8b.json", 2)]
)
def test_triton_path_equals_reference_path_at_real_shapes(file: str, num_layers: int) -> None:
    config = _real_config(file, num_layers)
    gen = torch.Generator().manual_seed(0)
    sequences = {
        f"r{i}": torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
        for i, n in enumerate([306, 135, 23, 70])
    }  # prompts + 6 decode steps
    chunk = {"r0": 200, "r1": 129, "r2": 5, "r3": 64}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_model(config, dtype=dtype, device="cuda", seed=1)
        assert isinstance(model, DecoderModel)
        logits = {}
        for backend in ("triton", "torch"):
            _set_backend(model, backend)
            logits[backend] = run_paged_forced(
                model, sequences, block_size=16, first_chunk=chunk, num_decode=6
            )
        for k in sequences:
            got, want = logits["triton"][k], logits["torch"][k]
            if dtype == torch.float32:
                # Random Qwen3 logits have std ~32 (tied N(0,1) embeddings); reordering the
                # attention sums alone (a CPU emulation) moved logprobs by up to 4e-4.
                err = (got.log_softmax(-1) - want.log_softmax(-1)).abs().max().item()
                assert err < 2e-3, f"{file}/{k}: {err}"
            else:
                # bf16: the kernel rounds P to bf16 for the P@V product (as FlashAttention);
                # a torch emulation of that rounding gives row cosines >= 0.9996 and equal
                # argmaxes at the Qwen3-0.6B shape.
                _assert_bf16_logits_agree(got, want, f"{file}/{k}")
        del model
        torch.cuda.empty_cache()


def _assert_bf16_logits_agree(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """bf16 logits rows of two paths at cosine >= 0.999, and the top-1 choices equal except at
    near ties (``logit_agreement``: within 4x the rows' RMS difference or two bf16 ulps). Random
    weights make many near ties: at the 8B-layer shape 7 of 306 top-1 choices of the Triton
    path differed from the torch path's (H200, 2026-12-02), all within two ulps (0.0625 at a
    logit of 4-8) while every row had cosine >= 0.9999."""
    assert_logits_agree(got, want, what, min_cos=0.999)


def test_decode_step_replays_from_a_cuda_graph() -> None:
    # runner_v2 captures decode steps: the forward (Triton path) must be capturable, with all
    # per-step inputs in static buffers, and a replay must equal the eager step.
    model = load_model(ModelConfig.from_hf_dict(TINY_DECODER_CONFIGS["qwen3"]), device="cuda")
    assert isinstance(model, DecoderModel)
    check_decode_graph_replay(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layer_ops_equal_the_torch_ops_at_the_qwen3_shape(dtype: torch.dtype) -> None:
    # RMSNorm (+ residual add, + Qwen3's per-head q/k norm) and SiLU·mul as one Triton kernel
    # each, against the chain of torch kernels they replace, on the same weights and tokens.
    from turnout.engine.model.layers import set_fused_layer_ops

    config = _real_config("qwen3-0.6b.json", 28)
    gen = torch.Generator().manual_seed(2)
    sequences = {
        f"r{i}": torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
        for i, n in enumerate([260, 40, 9])
    }
    chunk = {"r0": 128, "r1": 33, "r2": 3}
    model = load_model(config, dtype=dtype, device="cuda", seed=4)
    assert isinstance(model, DecoderModel)
    logits = {}
    try:
        for fused in (True, False):
            set_fused_layer_ops(fused)
            logits[fused] = run_paged_forced(
                model, sequences, block_size=16, first_chunk=chunk, num_decode=4
            )
    finally:
        set_fused_layer_ops(True)
    for k in sequences:
        got, want = logits[True][k], logits[False][k]
        if dtype == torch.float32:
            err = (got.log_softmax(-1) - want.log_softmax(-1)).abs().max().item()
            assert err < 1e-3, f"{k}: {err}"
        else:
            _assert_bf16_logits_agree(got, want, k)
    del model
    torch.cuda.empty_cache()
