"""Acceptance (b): the shipped SmolLM2-135M-Instruct Q4_1 GGUF loads, tokenises with its chat
template and answers greedily, in agreement with HF transformers loading the same file.

Tolerance: transformers dequantises to bit-identical float32 weights (checked below), so the
only difference is float32 summation order (fused q/k/v and gate/up GEMMs, the attention
formulation) compounded over 30 layers: measured 6e-5 on logprobs; asserted at 5e-4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from paged_session import PagedSession, greedy_generate

from turnout.engine.model import DecoderModel, load_model
from turnout.engine.model.gguf_loader import PlainGGUFReader
from turnout.engine.model.tokenizer import Tokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def ours(smollm2_gguf: Path) -> tuple[DecoderModel, Tokenizer]:
    model = load_model(smollm2_gguf)
    assert isinstance(model, DecoderModel)
    return model, load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def answer(ours: tuple[DecoderModel, Tokenizer]) -> tuple[list[int], list[int]]:
    """The chat prompt's ids and our greedy continuation (up to EOS, 24 tokens at most)."""
    model, tok = ours
    ids = tok.encode(tok.apply_chat_template(QUESTION), add_special_tokens=False)
    return ids, greedy_generate(model, ids, max_new_tokens=24, eos_token_id=tok.eos_token_id)


@pytest.fixture(scope="module")
def hf(smollm2_gguf: Path) -> tuple[Any, Any]:
    """transformers' own GGUF loading, its reader given a plain view of the file's memory map
    (``PlainGGUFReader``, held equal to ``gguf.GGUFReader`` in test_gguf_loader): it parses
    the header three times, 13 of its 27 s in numpy's memmap bookkeeping."""
    path = smollm2_gguf
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", PlainGGUFReader)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tok


def test_config_from_gguf_header(ours: tuple[DecoderModel, Tokenizer]) -> None:
    c = ours[0].config
    assert (
        c.architecture,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.vocab_size,
        c.rope_theta,
    ) == ("LlamaForCausalLM", 30, 9, 3, 64, 49152, 100000.0)
    assert c.tie_word_embeddings and ours[0].lm_head.weight is ours[0].model.embed_tokens.weight
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)


def test_chat_answer_names_paris(
    ours: tuple[DecoderModel, Tokenizer], answer: tuple[list[int], list[int]]
) -> None:
    tok = ours[1]
    prompt = tok.apply_chat_template(QUESTION, add_generation_prompt=True)
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.encode(prompt, add_special_tokens=False) == answer[0]
    out = answer[1]
    assert out[-1] == tok.eos_token_id, "the answer should end with <|im_end|>"
    text = tok.decode(out)
    assert "Paris" in text and text.rstrip().endswith("."), text


def test_weights_tokens_logits_and_greedy_match_transformers(
    ours: tuple[DecoderModel, Tokenizer], hf: tuple[Any, Any], answer: tuple[list[int], list[int]]
) -> None:
    model, tok = ours
    hf_model, hf_tok = hf
    # Dequantisation and the q/k un-permutation give HF's exact weights.
    hf_state = hf_model.state_dict()
    layer = model.model.layers[7].self_attn
    assert torch.equal(
        hf_state["model.layers.7.self_attn.q_proj.weight"], layer.qkv_proj.weight[:576]
    )
    assert torch.equal(
        hf_state["model.layers.7.self_attn.k_proj.weight"], layer.qkv_proj.weight[576:768]
    )
    ids = answer[0]
    assert (
        ids
        == hf_tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )
    session = PagedSession(model, num_blocks=16, block_size=16)
    session.add("r", ids)
    logprobs = session.step({"r": len(ids)})["r"].log_softmax(-1)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        want = hf_model.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id
        )[0, len(ids) :].tolist()
    assert (logprobs - ref).abs().max().item() < 5e-4
    assert answer[1] == want


def test_tokenizer_round_trips_and_matches_transformers(
    ours: tuple[DecoderModel, Tokenizer], hf: tuple[Any, Any]
) -> None:
    tok, hf_tok = ours[1], hf[1]
    for text in ["Hello world 2024!  x\n\ny", "café naïve 日本語 <|im_end|> done", " lead"]:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text)
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_end|>") == [2]  # control tokens stay whole


def test_quantization_of_the_file_is_read_and_reported(
    ours: tuple[DecoderModel, Tokenizer],
) -> None:
    from turnout.engine.model.gguf_loader import GGUFQuantization

    model = ours[0]
    # general.file_type 3 (MOSTLY_Q4_1); the embedding is Q8_0, the norms F32.
    assert model.config.quantization == GGUFQuantization(
        "MOSTLY_Q4_1", (("Q4_1", 210), ("F32", 61), ("Q8_0", 1))
    )
    assert model.config.quantization_method == "gguf"  # vLLM's --quantization name
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32  # dequantised
    assert str(model.quantization_report) == (
        "weights: gguf (file type MOSTLY_Q4_1; tensors: 210 Q4_1, 61 F32, 1 Q8_0): dequantised to "
        "float32 on load; turnout has no GGUF kernel, so GGUF weights run unquantised on every "
        "device, GPU included"
    )
