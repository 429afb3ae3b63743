"""The pooling architectures in the model layer: their config facts (labels, the cross-encoder
activation, the tasks each serves), checkpoints our random-weight writer makes that
transformers loads with every tensor in place and the same logits, and the step-local paged
cache a pooling decoder prefills into (engine/runner_pooling.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_model_configs import MS_MARCO_CROSS_ENCODER, TINY_ENCODER_CONFIGS, TINY_REWARD_CONFIGS

from turnout.engine.model import (
    BertForSequenceClassification,
    LlamaForSequenceClassification,
    ModelConfig,
    ModelConfigError,
    load_model,
    write_random_weights,
)
from turnout.engine.runner_pooling import PoolingKVScratch, pool_decoder, pool_encoder

CPU = torch.device("cpu")
CLASSIFIER = TINY_ENCODER_CONFIGS["bert-classifier"]
REWARD = TINY_REWARD_CONFIGS["llama-reward"]


def test_the_published_cross_encoder_config() -> None:
    c = ModelConfig.from_hf_dict(MS_MARCO_CROSS_ENCODER)
    assert c.is_encoder and c.is_pooling and c.classifier is not None
    assert (c.classifier.num_labels, c.classifier.labels, c.classifier.score_activation) == (
        1,
        ("LABEL_0",),
        "identity",
    )
    assert c.pooling_tasks == ("classify", "score")
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c  # the head's fields round-trip


TASKS = [
    ("BertModel", TINY_ENCODER_CONFIGS["bert"], ("embed",)),
    ("3-label classifier: no pairs", CLASSIFIER, ("classify",)),
    ("one type: no pairs", {**MS_MARCO_CROSS_ENCODER, "type_vocab_size": 1}, ("classify",)),
    ("reward model", REWARD, ("classify", "reward")),
    ("causal LM", {**REWARD, "architectures": ["LlamaForCausalLM"]}, ()),
]


@pytest.mark.parametrize(("note", "cfg", "tasks"), TASKS, ids=[t[0] for t in TASKS])
def test_the_tasks_each_architecture_serves(
    note: str, cfg: dict[str, Any], tasks: tuple[str, ...]
) -> None:
    c = ModelConfig.from_hf_dict(cfg)
    assert c.pooling_tasks == tasks and c.is_pooling == bool(tasks)


HEADS = [
    ("num_labels alone", {"num_labels": 4}, 4, "sigmoid"),
    ("transformers' default: two labels", {}, 2, "sigmoid"),
    (
        "sigmoid named",
        {
            "id2label": {"0": "x"},
            "sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid",
        },
        1,
        "sigmoid",
    ),
]


@pytest.mark.parametrize(
    ("note", "fields", "num_labels", "activation"), HEADS, ids=[h[0] for h in HEADS]
)
def test_the_head_is_read(
    note: str, fields: dict[str, Any], num_labels: int, activation: str
) -> None:
    base = {k: v for k, v in CLASSIFIER.items() if k not in ("id2label", "label2id")}
    c = ModelConfig.from_hf_dict({**base, **fields}).classifier
    assert c is not None and (c.num_labels, c.score_activation) == (num_labels, activation)


BAD_HEADS = [
    ({"num_labels": 2}, r"`num_labels` \(2\) and `id2label` \(3 labels\) disagree"),
    ({"id2label": {"0": "a", "2": "b"}}, r"`id2label` must number labels 0..n-1, got \[0, 2\]"),
    ({"id2label": {"x": "a"}}, r"`id2label` keys must be label ids"),
    (
        {"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"},
        r"`sbert_ce_default_activation_function` 'torch.nn.modules.activation.Tanh' is not supported",
    ),
    (
        {"quantization_config": {"quant_method": "fp8"}},
        r"FP8 weights are supported for generating decoders only",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD_HEADS, ids=[m for _, m in BAD_HEADS])
def test_a_head_that_cannot_be_served_is_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf_dict({**CLASSIFIER, **fields})


def _hf_from_dir(path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    return model.eval()


def test_our_bert_classifier_checkpoint_loads_in_transformers(tmp_path: Path) -> None:
    write_random_weights(CLASSIFIER, tmp_path, dtype=torch.float32, seed=4)
    ours = load_model(tmp_path)
    assert isinstance(ours, BertForSequenceClassification)
    prompts = [[2, 40, 7, 1], [9, 8], [5, 6, 7, 8, 9, 10]]
    types = [(0, 0, 1, 1), None, (0, 0, 0, 1, 1, 1)]
    with torch.inference_mode():
        got = pool_encoder(ours, prompts, types, CPU)
    hf = _hf_from_dir(tmp_path)
    for i, (p, t) in enumerate(zip(prompts, types, strict=True)):
        kwargs = {"token_type_ids": torch.tensor([t])} if t is not None else {}
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([p]), **kwargs).logits[0]
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)
    with torch.inference_mode():  # the token types are honoured: the second segment counts
        untyped = pool_encoder(ours, prompts[:1], [None], CPU)
    assert (untyped - got[:1]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "attn_backend", ["torch", "triton"]
)  # triton: the CUDA kernels, interpreted
def test_our_reward_checkpoint_loads_in_transformers(tmp_path: Path, attn_backend: str) -> None:
    write_random_weights(REWARD, tmp_path, dtype=torch.float32, seed=4)
    ours = load_model(tmp_path, attn_backend=attn_backend)
    assert isinstance(ours, LlamaForSequenceClassification) and not hasattr(ours, "lm_head")
    prompts = [[5, 6, 7], list(range(3, 40)), [9]]
    scratch = PoolingKVScratch(
        ours, max_num_tokens=64, max_num_seqs=4, block_size=8, dtype=torch.float32, device=CPU
    )
    with torch.inference_mode():
        got = pool_decoder(ours, scratch, prompts, CPU)
    hf = _hf_from_dir(tmp_path)
    with torch.no_grad():
        want = torch.stack([hf(input_ids=torch.tensor([p])).logits[0] for p in prompts])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="has no LM head: it does not generate"):
        ours.compute_logits(torch.zeros(1, REWARD["hidden_size"]))


def test_the_scratch_lays_prompts_out_from_fresh_blocks() -> None:
    model = load_model(ModelConfig.from_hf_dict(REWARD), seed=1)
    assert isinstance(model, LlamaForSequenceClassification)
    scratch = PoolingKVScratch(
        model, max_num_tokens=40, max_num_seqs=4, block_size=16, dtype=torch.float32, device=CPU
    )
    assert scratch.num_blocks == 3 + 4  # cdiv(40, 16) + one partial block per request
    positions, last, md = scratch.metadata([1, 17, 16, 5], CPU)
    assert md.query_start_loc.tolist() == [0, 1, 18, 34, 39] and md.seq_lens.tolist() == [
        1,
        17,
        16,
        5,
    ]
    assert md.block_table.tolist() == [[0, 0], [1, 2], [3, 0], [4, 0]]
    assert last.tolist() == [0, 17, 33, 38]
    assert positions.tolist() == [0, *range(17), *range(16), *range(5)]
    assert md.slot_mapping.tolist() == [0, *range(16, 33), *range(48, 64), *range(64, 69)]
    assert (md.max_query_len, md.max_seq_len, md.num_actual_tokens) == (17, 17, 39)
    # The worst a step can be: every request leaves a block partly empty.
    scratch.metadata([1, 1, 1, 37], CPU)  # 1 + 1 + 1 + 3 = 6 blocks of 7
    with pytest.raises(ValueError, match="8 KV blocks needed, the pooling scratch has 7"):
        scratch.metadata([17, 17, 17, 17], CPU)  # beyond one step's 40 tokens
