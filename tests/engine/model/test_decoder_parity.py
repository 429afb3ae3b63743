"""Acceptance (a): our decoder equals HF transformers on the same weights (fp32), through the
paged KV path: chunked prefill mixed with decodes, block_size 4 so sequences span many
scattered blocks; logprobs within 1e-4 at every position, greedy tokens equal HF generate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from paged_session import run_paged_greedy
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import load_model, write_random_weights

transformers = pytest.importorskip("transformers")

NUM_NEW_TOKENS = 8
PROMPT_LENS = {"a": 5, "b": 13, "c": 22}
FIRST_CHUNK = {"a": 5, "b": 7, "c": 9}  # b and c finish their prefill in the second step


def _prompts(vocab_size: int) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(7)
    return {
        k: torch.randint(3, vocab_size, (n,), generator=gen).tolist()
        for k, n in PROMPT_LENS.items()
    }


@pytest.fixture(scope="module", params=sorted(TINY_DECODER_CONFIGS))
def weights_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param)
    write_random_weights(TINY_DECODER_CONFIGS[request.param], out, dtype=torch.float32, seed=3)
    return request.param, out


def _hf_model(path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.generation_config.eos_token_id = None  # compare fixed-length greedy continuations
    model.generation_config.pad_token_id = 0
    return model


def test_logprobs_and_greedy_tokens_match_hf(weights_dir: tuple[str, Path]) -> None:
    name, path = weights_dir
    ours = load_model(path)
    hf = _hf_model(path)
    prompts = _prompts(ours.config.vocab_size)
    sequences, logits = run_paged_greedy(
        ours, prompts, block_size=4, first_chunk=FIRST_CHUNK, num_new_tokens=NUM_NEW_TOKENS
    )
    for k, prompt in prompts.items():
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS, do_sample=False
            )[0].tolist()
            ref_logits = hf(torch.tensor([sequences[k][:-1]])).logits[0]
        assert sequences[k] == want, f"{name}/{k}: greedy tokens differ from HF generate"
        got_lp = logits[k].log_softmax(-1)
        ref_lp = ref_logits.log_softmax(-1)
        assert got_lp.shape == ref_lp.shape
        err = (got_lp - ref_lp).abs().max().item()
        assert err <= 1e-4, f"{name}/{k}: logprobs differ from HF by {err}"


def test_hf_loaded_exactly_the_written_weights(weights_dir: tuple[str, Path]) -> None:
    # Guards the parity test: HF must not have initialised anything we did not write.
    _, path = weights_dir
    ours = load_model(path)
    hf_state = _hf_model(path).state_dict()
    our_embed = ours.model.embed_tokens.weight
    assert torch.equal(hf_state["model.embed_tokens.weight"], our_embed)
    q_size = ours.config.num_attention_heads * ours.config.head_dim
    assert torch.equal(
        hf_state["model.layers.1.self_attn.q_proj.weight"],
        ours.model.layers[1].self_attn.qkv_proj.weight[:q_size],
    )
    assert torch.equal(hf_state["lm_head.weight"], ours.lm_head.weight)
