"""The pooling architectures' own config facts: the BERT encoders' fields, which pooling tasks
each architecture serves, and the sequence-classification head (``ClassifierConfig``: labels,
and the activation of a cross-encoder's score). Imports no torch.

Pooling architectures and their tasks (vLLM's task names, ``engine.pooling_params``):

- ``BertModel``: ``embed`` (mean pooling, L2 normalisation);
- ``BertForSequenceClassification``: ``classify``, and ``score`` (cross-encoder pairs) when it
  has one label (a relevance logit);
- ``LlamaForSequenceClassification``: ``classify`` and ``reward`` (the head at the last token:
  reward models such as Skywork-Reward-Llama-3.1-8B).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EMBEDDING_ARCHITECTURES = ("BertModel",)
SEQUENCE_CLASSIFICATION_ARCHITECTURES = (
    "BertForSequenceClassification",
    "LlamaForSequenceClassification",
)
#: Decoders whose head pools (the Llama body, a ``score`` head at the last token).
POOLING_DECODER_ARCHITECTURES = ("LlamaForSequenceClassification",)

#: sentence-transformers' ``CrossEncoder`` default activation names (the config's
#: ``sbert_ce_default_activation_function``) -> the activation ``score`` applies.
CROSS_ENCODER_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
}
_ACTIVATION_KEY = "sbert_ce_default_activation_function"


@dataclass(frozen=True)
class ClassifierConfig:
    """A sequence-classification head.

    Attributes:
        num_labels: outputs of the head (HF ``num_labels``: ``len(id2label)``, default 2).
        labels: label names by id (HF ``id2label``).
        score_activation: what ``score`` applies to a one-label logit: ``"sigmoid"`` (what
            sentence-transformers' ``CrossEncoder`` does for one label) unless the config's
            ``sbert_ce_default_activation_function`` names Identity (ms-marco cross-encoders:
            raw logits) or Sigmoid.
        activation_name: that config value as given (``None``: not set), written back.
    """

    num_labels: int
    labels: tuple[str, ...]
    score_activation: str = "sigmoid"
    activation_name: str | None = None

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> ClassifierConfig:
        """Read ``id2label`` / ``num_labels`` and the cross-encoder activation.

        Raises:
            ModelConfigError: ``num_labels`` and ``id2label`` disagree, label ids are not
                ``0..n-1``, or the activation is not Identity or Sigmoid (named).
        """
        from turnout.engine.model.config import ModelConfigError  # config imports this module

        id2label = d.get("id2label")
        num_labels = d.get("num_labels")
        if id2label:
            if not isinstance(id2label, Mapping):
                raise ModelConfigError(
                    f"config field `id2label` must be an object, got {id2label!r}"
                )
            try:
                by_id = {int(k): str(v) for k, v in id2label.items()}
            except ValueError:
                raise ModelConfigError(
                    f"config field `id2label` keys must be label ids, got {sorted(id2label)}"
                ) from None
            if sorted(by_id) != list(range(len(by_id))):
                raise ModelConfigError(
                    f"config field `id2label` must number labels 0..n-1, got {sorted(by_id)}"
                )
            if num_labels is not None and num_labels != len(by_id):
                raise ModelConfigError(
                    f"config fields `num_labels` ({num_labels}) and `id2label` "
                    f"({len(by_id)} labels) disagree"
                )
            labels = tuple(by_id[i] for i in range(len(by_id)))
        else:
            n = 2 if num_labels is None else num_labels  # transformers' PretrainedConfig default
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ModelConfigError(
                    f"config field `num_labels` must be a positive integer, got {n!r}"
                )
            labels = tuple(f"LABEL_{i}" for i in range(n))
        name = d.get(_ACTIVATION_KEY)
        if name is not None and name not in CROSS_ENCODER_ACTIVATIONS:
            raise ModelConfigError(
                f"config field `{_ACTIVATION_KEY}` {name!r} is not supported; "
                f"supported: {', '.join(CROSS_ENCODER_ACTIVATIONS)}"
            )
        activation = CROSS_ENCODER_ACTIVATIONS[name] if name is not None else "sigmoid"
        return cls(len(labels), labels, activation, name)

    def to_hf_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id2label": {str(i): n for i, n in enumerate(self.labels)},
            "label2id": {n: i for i, n in enumerate(self.labels)},
        }
        if self.activation_name is not None:
            out[_ACTIVATION_KEY] = self.activation_name
        return out


def bert_model_config(arch: str, d: Mapping[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    """The BERT encoders' fields beyond ``common`` (the fields every architecture reads).

    Raises:
        ModelConfigError: an activation other than GELU, positions other than absolute, or a
            hidden size that the heads do not divide.
    """
    from turnout.engine.model.config import ModelConfigError  # config imports this module

    if common["hidden_act"] != "gelu":
        raise ModelConfigError(f"hidden_act {common['hidden_act']!r}: {arch} supports 'gelu'")
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ModelConfigError(f"position_embedding_type must be 'absolute' for {arch}")
    num_heads = common["num_attention_heads"]
    if common["hidden_size"] % num_heads:
        raise ModelConfigError("hidden_size must be a multiple of num_attention_heads")
    return {
        "num_key_value_heads": num_heads,
        "head_dim": common["hidden_size"] // num_heads,
        "layer_norm_eps": float(d.get("layer_norm_eps", 1e-12)),
        "type_vocab_size": int(d.get("type_vocab_size", 2)),
    }


def pooling_tasks_of(
    architecture: str, classifier: ClassifierConfig | None, type_vocab_size: int = 2
) -> tuple[str, ...]:
    """The pooling tasks a model of ``architecture`` serves (empty: it generates). ``score``
    needs one label and two token types (the pair's segments)."""
    if architecture in EMBEDDING_ARCHITECTURES:
        return ("embed",)
    if architecture in POOLING_DECODER_ARCHITECTURES:
        return ("classify", "reward")
    if architecture in SEQUENCE_CLASSIFICATION_ARCHITECTURES:
        assert classifier is not None
        pairs = classifier.num_labels == 1 and type_vocab_size >= 2
        return ("classify", "score") if pairs else ("classify",)
    return ()


__all__ = [
    "CROSS_ENCODER_ACTIVATIONS",
    "EMBEDDING_ARCHITECTURES",
    "POOLING_DECODER_ARCHITECTURES",
    "SEQUENCE_CLASSIFICATION_ARCHITECTURES",
    "ClassifierConfig",
    "bert_model_config",
    "pooling_tasks_of",
]
