"""The BERT encoder (``BertModel``, Devlin et al. 2019) for pooling: sentence embeddings by mean
pooling over the attention mask and L2 normalisation (sentence-transformers' ``Pooling`` +
``Normalize``, Reimers & Gurevych 2019); and ``BertForSequenceClassification`` (the pooler,
``tanh(dense(h[CLS]))``, then a linear classifier), which cross-encoders are (Nogueira & Cho
2019, "Passage Re-ranking with BERT"). Parameter names are HF's.

The encoder attends bidirectionally within each sequence and keeps no KV cache, so it uses
dense masked attention over ``[B, L]`` batches rather than the paged path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from turnout.engine.model.config import ModelConfig

if TYPE_CHECKING:
    from turnout.engine.model.quantization import QuantizationReport


class BertEmbeddings(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, L] int64
        token_type_ids: torch.Tensor | None = None,  # [B, L] int64; None: all 0
    ) -> torch.Tensor:  # [B, L, H]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # No token types: all 0, as HF defaults for a single sentence.
        types = (
            self.token_type_embeddings.weight[0]
            if token_type_ids is None
            else self.token_type_embeddings(token_type_ids)
        )
        h = self.word_embeddings(input_ids) + types + self.position_embeddings(positions)[None]
        normed: torch.Tensor = self.LayerNorm(h)
        return normed


class BertSelfAttention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, seq, _ = h.shape

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, L, H] -> [B, heads, L, head_dim]
            return x.view(b, seq, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.query(h)), heads(self.key(h)), heads(self.value(h)), attn_mask=mask
        )
        return out.transpose(1, 2).reshape(b, seq, -1)


class BertDenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: HF's ``BertSelfOutput`` / ``BertOutput``."""

    def __init__(self, in_features: int, c: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        normed: torch.Tensor = self.LayerNorm(self.dense(x) + residual)
        return normed


class BertAttention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertDenseNorm(c.hidden_size, c)


class BertIntermediate(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertDenseNorm(c.intermediate_size, c)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.attention.output(self.attention.self(h, mask), h)
        out: torch.Tensor = self.output(F.gelu(self.intermediate.dense(h)), h)  # exact (erf) GELU
        return out


class BertEncoder(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))


class EncoderModel(nn.Module):
    """``BertModel`` with mean pooling and L2 normalisation."""

    #: What the weights are and how they run (set by ``engine.model.load_model``).
    quantization_report: QuantizationReport

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.is_encoder:
            raise ValueError(f"{config.architecture} is a decoder: use DecoderModel")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, L] int64
        attention_mask: torch.Tensor,  # [B, L], 1 = token, 0 = padding
        token_type_ids: torch.Tensor | None = None,  # [B, L] int64 segment ids; None: all 0
    ) -> torch.Tensor:  # [B, L, hidden_size], model dtype
        """Last hidden states (HF ``last_hidden_state``).

        Raises:
            ValueError: shapes disagree or a sequence exceeds ``max_position_embeddings``.
        """
        shapes = [t.shape for t in (input_ids, attention_mask, token_type_ids) if t is not None]
        if len(set(shapes)) != 1 or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids, attention_mask and token_type_ids must be equal [B, L], "
                f"got {[tuple(x) for x in shapes]}"
            )
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds "
                f"max_position_embeddings {self.config.max_position_embeddings}"
            )
        keep = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, L]: keys a query may see
        h: torch.Tensor = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder.layer:
            h = layer(h, keep)
        return h

    def embed(
        self,
        input_ids: torch.Tensor,  # [B, L] int64
        attention_mask: torch.Tensor,  # [B, L]
    ) -> torch.Tensor:  # [B, hidden_size] float32, unit L2 norm
        """Sentence embeddings: masked mean of the last hidden states, L2-normalised."""
        h = self.forward(input_ids, attention_mask).float()
        mask = attention_mask.to(h.dtype).unsqueeze(-1)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=-1)

    def pool(
        self,
        input_ids: torch.Tensor,  # [B, L] int64
        attention_mask: torch.Tensor,  # [B, L]
        token_type_ids: torch.Tensor | None = None,  # [B, L] int64
    ) -> torch.Tensor:  # [B, hidden_size] float32
        """The model's pooled output, here the embedding.

        Raises:
            ValueError: ``token_type_ids`` given (an embedding model takes single texts).
        """
        if token_type_ids is not None:
            raise ValueError(f"{self.config.architecture} embeds single texts: no token_type_ids")
        return self.embed(input_ids, attention_mask)


class BertPooler(nn.Module):
    """HF's ``BertPooler``: ``tanh(dense(h[:, 0]))``, the [CLS] token's hidden state."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, L, H] -> [B, H]
        return torch.tanh(self.dense(h[:, 0]))


class BertForSequenceClassification(EncoderModel):
    """``BertForSequenceClassification``: ``classifier(pooler(h))`` logits (dropout is an
    identity at inference). HF names: ``bert.*`` (the encoder and ``bert.pooler``, the prefix
    stripped on load) and ``classifier.*``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.classifier is None:
            raise ValueError(f"{config.architecture} has no classifier config")
        self.pooler = BertPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.classifier.num_labels)

    def pool(
        self,
        input_ids: torch.Tensor,  # [B, L] int64
        attention_mask: torch.Tensor,  # [B, L]
        token_type_ids: torch.Tensor | None = None,  # [B, L] int64: 0 first segment, 1 second
    ) -> torch.Tensor:  # [B, num_labels] float32 logits
        """Classification logits (HF ``logits``) of each sequence or pair."""
        h = self.forward(input_ids, attention_mask, token_type_ids)
        logits: torch.Tensor = self.classifier(self.pooler(h))
        return logits.float()
