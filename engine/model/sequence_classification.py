"""``LlamaForSequenceClassification``: the Llama decoder body with a ``score`` head
(``Linear(hidden_size, num_labels, bias=False)``) read at one token per sequence: reward models
(Skywork-Reward-Llama-3.1-8B) and decoder classifiers. HF names: ``model.*`` and
``score.weight``; there is no LM head.

The body runs exactly as the causal LM's does (causal attention over the paged cache); the head
is applied by :meth:`LlamaForSequenceClassification.pool` to the hidden states the caller
selects: the last token of each prompt (vLLM's ``LAST`` pooling; transformers picks the last
token that is not ``pad_token_id``, the same one for a prompt that does not end in padding).
"""

from __future__ import annotations

import torch
from torch import nn

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.llama import DecoderModel
from turnout.engine.model.weights import decoder_weight_shapes


class LlamaForSequenceClassification(DecoderModel):
    """A Llama-family body and a ``score`` head; ``forward`` is the body's (final hidden
    states of packed tokens), :meth:`pool` the head."""

    def __init__(self, config: ModelConfig, attn_backend: str = "auto") -> None:
        super().__init__(config, attn_backend)
        if config.classifier is None:
            raise ValueError(f"{config.architecture} has no classifier config")
        del self.lm_head  # a classifier has no LM head (HF's class has none either)
        self.score = nn.Linear(config.hidden_size, config.classifier.num_labels, bias=False)

    @classmethod
    def hf_weight_shapes(cls, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """The body's tensors and ``score.weight [num_labels, hidden_size]``."""
        assert config.classifier is not None
        shapes = {k: v for k, v in decoder_weight_shapes(config).items() if k != "lm_head.weight"}
        return shapes | {"score.weight": (config.classifier.num_labels, config.hidden_size)}

    def tie_weights(self) -> None:
        """Nothing to tie: there is no LM head."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raises ValueError: a classifier has no LM head (use :meth:`pool`)."""
        raise ValueError(f"{self.config.architecture} has no LM head: it does not generate")

    def pool(
        self,
        hidden: torch.Tensor,  # [N, hidden_size], one selected token per sequence
    ) -> torch.Tensor:  # [N, num_labels] float32
        """The head's logits (HF ``logits``) of the selected hidden states."""
        logits: torch.Tensor = self.score(hidden)
        return logits.float()


__all__ = ["LlamaForSequenceClassification"]
