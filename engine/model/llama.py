"""The Llama-family decoder: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v
bias), Qwen3ForCausalLM (per-head q/k RMSNorm), and their mixture-of-experts relatives
Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and GraniteMoeForCausalLM, whose sparse layers carry
an ``engine.model.moe.SparseMoeBlock`` as ``mlp`` (``config.moe.is_moe_layer``). GraniteMoe's
multipliers (``config.granite``) scale the embeddings, the attention, the residual branches
and the logits. Plain PyTorch over packed tokens ``[T, ...]``.

Parameter names are HF's except two fused projections, filled from HF's pieces on load
(:data:`FUSED_PARAMS`): ``qkv_proj = [q_proj; k_proj; v_proj]`` and ``gate_up_proj =
[gate_proj; up_proj]`` (one GEMM instead of three/two, as vLLM's ``QKVParallelLinear``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from turnout.engine.model.attention import paged_attention_forward
from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.config import ModelConfig
from turnout.engine.model.kv_cache import FullAttentionSpec, KVCacheSpec
from turnout.engine.model.layers import GatedMLP, RMSNorm, RotaryEmbedding
from turnout.engine.model.moe import SparseMoeBlock
from turnout.engine.model.weights import decoder_weight_shapes

if TYPE_CHECKING:
    from turnout.engine.model.parallel_layers import TensorParallel
    from turnout.engine.model.quantization import QuantizationReport

# fused parameter name part -> the HF name parts concatenated (dim 0) into it, in order
FUSED_PARAMS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


class DecoderAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # GraniteMoe: attention_multiplier is the softmax scale (transformers' `scaling`)
        self.scale = config.granite.attention_multiplier if config.granite else self.head_dim**-0.5
        self.sliding_window = config.sliding_window
        self.backend = backend
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.has_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.has_qk_norm else None

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v, kv_written = rotary.forward_qkv(
            positions,
            self.qkv_proj(hidden),
            self.num_heads,
            self.num_kv_heads,
            self.q_norm,
            self.k_norm,
            kv_cache if self.backend != "torch" else None,
            attn_metadata.slot_mapping,
        )
        out = paged_attention_forward(
            q,
            k,
            v,
            kv_cache,
            attn_metadata,
            scale=self.scale,
            sliding_window=self.sliding_window,
            backend=self.backend,
            kv_written=kv_written,
        )
        projected: torch.Tensor = self.o_proj(out.view(num_tokens, self.q_size))
        return projected


class PreNormDecoderLayer(nn.Module):
    """A pre-norm decoder layer: ``h += attn(norm(h)); h += mlp(norm(h))`` (HF Llama's and
    DeepSeek-V2's order). Subclasses set ``self_attn``, ``mlp``, ``input_layernorm``,
    ``post_attention_layernorm`` and ``residual_multiplier`` (GraniteMoe's, else None)."""

    self_attn: nn.Module
    mlp: nn.Module
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm
    residual_multiplier: float | None = None

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        branch: torch.Tensor,  # [T, hidden]: the last layer's MLP output (or the embeddings)
        rotary: nn.Module,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        residual: torch.Tensor
        | None = None,  # [T, hidden]: the stream before that add (None: first)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's scaled MLP output, the stream)
        """The layer with each residual add fused into the RMSNorm after it (vLLM's
        ``fused_add_rms_norm`` layout): the stream passes from layer to layer unsummed, so the
        add of one layer's MLP output happens in the next layer's input norm; HF's layer output
        is the sum of the two returned tensors. ``residual`` may be updated in place."""
        if residual is None:
            residual, normed = branch, self.input_layernorm(branch)
        else:
            normed, residual = self.input_layernorm.add_forward(branch, residual)
        attn = self.self_attn(positions, normed, rotary, kv_cache, attn_metadata)
        normed, residual = self.post_attention_layernorm.add_forward(self._scaled(attn), residual)
        return self._scaled(self.mlp(normed)), residual

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        # GraniteMoe multiplies each branch before the residual add (transformers' order)
        return branch if self.residual_multiplier is None else branch * self.residual_multiplier


class DecoderLayer(PreNormDecoderLayer):
    def __init__(self, config: ModelConfig, backend: str, layer_idx: int = 0) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(config, backend)
        self.mlp: GatedMLP | SparseMoeBlock = (
            SparseMoeBlock(config.hidden_size, config.moe, backend)
            if config.moe is not None and config.moe.is_moe_layer(layer_idx)
            else GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_multiplier = config.granite.residual_multiplier if config.granite else None


class DecoderBody(nn.Module):
    """HF's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, backend, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class DecoderModel(nn.Module):
    """A causal LM of the Llama family over paged KV caches.

    ``forward`` maps packed tokens to final hidden states; ``compute_logits`` applies the LM
    head (tied to the embeddings when ``config.tie_word_embeddings``).

    Other decoders subclass it (``engine.model.registry``) and declare their own body
    (:meth:`build_body`: ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``), fused
    parameters, checkpoint names (:meth:`hf_weight_shapes`) and KV-cache layout
    (:meth:`kv_cache_spec_for`).
    """

    #: fused parameter name part -> the HF name parts concatenated (dim 0) into it, in order
    fused_params: ClassVar[dict[str, tuple[str, ...]]] = FUSED_PARAMS
    #: runner_v2 may replay mixed prefill + decode steps from graphs captured per token count:
    #: every launch of the forward is sized by host ints a padded step keeps (token and request
    #: counts), never by the step's own query lengths.
    MIXED_STEP_GRAPHS: ClassVar[bool] = True

    #: HF's ``model.`` prefix (:meth:`build_body`): each architecture's own modules, read by
    #: name (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``) and replaced by
    #: ``engine.model.parallel_layers`` in a tensor-parallel shard.
    model: Any
    #: The LM head: an ``nn.Linear``, or ``ParallelLMHead`` in a tensor-parallel shard.
    lm_head: nn.Module
    #: What the weights are and how they run (set by ``engine.model.load_model``).
    quantization_report: QuantizationReport
    #: This rank's group when the model is a tensor-parallel shard (set by ``shard_decoder``).
    tensor_parallel: TensorParallel

    def __init__(self, config: ModelConfig, attn_backend: str = "auto") -> None:
        super().__init__()
        if config.is_encoder:
            raise ValueError(f"{config.architecture} is an encoder: use EncoderModel")
        self.config = config
        self.model = self.build_body(config, attn_backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    @classmethod
    def build_body(cls, config: ModelConfig, attn_backend: str) -> nn.Module:
        """HF's ``model.`` prefix of this architecture."""
        return DecoderBody(config, attn_backend)

    @classmethod
    def hf_weight_shapes(cls, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """HF tensor names and shapes of a checkpoint of this architecture."""
        return decoder_weight_shapes(config)

    @classmethod
    def kv_cache_spec_for(cls, config: ModelConfig) -> KVCacheSpec:
        """What each layer keeps per token in the paged cache: keys and values per kv head."""
        return FullAttentionSpec(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
        )

    #: A tensor-parallel rank's share of the KV heads (set by ``engine.model.parallel_layers``).
    local_kv_cache_spec: KVCacheSpec | None = None

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """This model's paged-cache layout (:meth:`kv_cache_spec_for` of its config; of this
        rank's KV heads when the model is a tensor-parallel shard)."""
        if self.local_kv_cache_spec is not None:
            return self.local_kv_cache_spec
        return self.kv_cache_spec_for(self.config)

    def tie_weights(self) -> None:
        """Share the LM head with the input embeddings when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor],  # per layer, shaped as self.kv_cache_spec says
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size], model dtype
        """Run every layer over the step's packed tokens, reading/writing the paged caches.

        Raises:
            ValueError: ``kv_caches`` does not hold one cache per layer.
        """
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"expected {len(self.model.layers)} KV caches, got {len(kv_caches)}")
        hidden = self.model.embed_tokens(input_ids)
        if self.config.granite is not None:
            hidden = hidden * self.config.granite.embedding_multiplier
        rotary = self.model.rotary_emb
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, rotary, kv_cache, attn_metadata, residual)
        out: torch.Tensor
        if residual is None:  # no layers
            out = self.model.norm(hidden)
        else:
            out = self.model.norm.add_forward(hidden, residual)[0]
        return out

    def compute_logits(
        self,
        hidden: torch.Tensor,  # [N, hidden_size]
    ) -> torch.Tensor:  # [N, vocab_size] float32
        """LM-head logits of the selected hidden states, in float32 (GraniteMoe's divided by
        ``logits_scaling`` in the model dtype first, as transformers)."""
        logits: torch.Tensor = self.lm_head(hidden)
        if self.config.granite is not None:
            logits = logits / self.config.granite.logits_scaling
        return logits.float()
