"""Acceptance (c): all-MiniLM-L6-v2 embeddings (mean pooling + L2 normalisation) equal the
reference computed with HF transformers the way sentence-transformers does, cosine >= 0.9999."""

from __future__ import annotations

import pytest
import torch
from minilm_path import minilm_dir

from turnout.engine.model import EncoderModel, ModelConfig, load_model
from turnout.engine.model.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "A man is eating food.",
    "Rotary position embeddings rotate query/key pairs.",
    "short",
]


def _batch(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, ids))
    input_ids = torch.tensor([x + [0] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    return input_ids, mask


def _reference(texts: list[str]) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    model = transformers.AutoModel.from_pretrained(minilm_dir(), dtype=torch.float32).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


def test_minilm_embeddings_match_transformers() -> None:
    model = load_model(minilm_dir())
    assert isinstance(model, EncoderModel) and model.config.architecture == "BertModel"
    tok = load_tokenizer(minilm_dir())
    ids = [tok.encode(t) for t in TEXTS]
    assert ids[4] == [101, 2460, 102]  # [CLS] short [SEP]
    with torch.inference_mode():
        got = model.embed(*_batch(ids))
    want = _reference(TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == torch.float32
    cosine = (got * want).sum(-1)
    assert cosine.min().item() >= 0.9999, cosine
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(TEXTS)))
    # Semantics survive: the Paris sentence is nearest to the question.
    assert (got[0] @ got[1:].T).argmax().item() == 0


def test_padding_does_not_change_an_embedding() -> None:
    model = load_model(minilm_dir())
    tok = load_tokenizer(minilm_dir())
    ids = [tok.encode(t) for t in TEXTS[:2]]
    with torch.inference_mode():
        alone = model.embed(*_batch(ids[:1]))
        padded = model.embed(*_batch(ids))[:1]
    torch.testing.assert_close(padded, alone, atol=1e-6, rtol=0)


def test_random_bert_and_bad_input() -> None:
    config = ModelConfig.from_hf_dict(
        {
            "architectures": ["BertModel"],
            "vocab_size": 50,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "max_position_embeddings": 16,
            "hidden_act": "gelu",
        }
    )
    model = load_model(config, seed=1)
    assert isinstance(model, EncoderModel)
    with pytest.raises(ValueError, match="max_position_embeddings 16"):
        model.embed(torch.zeros(1, 17, dtype=torch.int64), torch.ones(1, 17))
    with pytest.raises(ValueError, match="must be equal"):
        model.embed(torch.zeros(1, 4, dtype=torch.int64), torch.ones(1, 5))
