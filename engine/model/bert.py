"""The BERT encoder (``BertModel``, Devlin et al. 2019) for pooling: sentence embeddings by mean
pooling over the attention mask and L2 normalisation (sentence-transformers' ``Pooling`` +
``Normalize``, Reimers & Gurevych 2019). Parameter names are HF's.

The encoder attends bidirectionally within each sequence and keeps no KV cache, so it uses
dense masked attention over ``[B, L]`` batches rather than the paged path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig


class BertEmbeddings(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, L] -> [B, L, H]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # token_type_ids are all 0 for single-sentence embedding (HF's default).
        h = (self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
             + self.position_embeddings(positions)[None])
        return self.LayerNorm(h)


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

        out = F.scaled_dot_product_attention(heads(self.query(h)), heads(self.key(h)),
                                             heads(self.value(h)), attn_mask=mask)
        return out.transpose(1, 2).reshape(b, seq, -1)


class BertDenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: HF's ``BertSelfOutput`` / ``BertOutput``."""

    def __init__(self, in_features: int, c: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


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
        return self.output(F.gelu(self.intermediate.dense(h)), h)  # exact (erf) GELU


class BertEncoder(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))


class EncoderModel(nn.Module):
    """``BertModel`` with mean pooling and L2 normalisation."""

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
    ) -> torch.Tensor:  # [B, L, hidden_size], model dtype
        """Last hidden states (HF ``last_hidden_state``).

        Raises:
            ValueError: shapes disagree or a sequence exceeds ``max_position_embeddings``.
        """
        if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask "
                             f"{tuple(attention_mask.shape)} must be equal [B, L]")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds "
                             f"max_position_embeddings {self.config.max_position_embeddings}")
        keep = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, L]: keys a query may see
        h = self.embeddings(input_ids)
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
