"""DeepseekV2ForCausalLM: multi-head latent attention (engine/model/mla.py) and DeepSeekMoE
feed-forward layers (engine/model/moe.py), after transformers' ``modeling_deepseek_v2.py`` and
DeepSeek's own ``modeling_deepseek.py``. Plain PyTorch over packed tokens ``[T, ...]``.

Layer ``i`` is an MoE layer (``SparseMoeBlock`` with DeepSeek's routing and shared experts)
when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0`` (``MoEConfig.is_moe_layer``:
DeepSeek's and vLLM's rule; transformers 5 ignores ``moe_layer_freq``, which every released
config sets to 1); the others are dense SiLU-gated MLPs of ``intermediate_size``. Parameter names are HF's except ``gate_up_proj`` of the dense MLPs
(``[gate_proj; up_proj]``, as the Llama family).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.deepseek_rope import DeepseekRotaryEmbedding
from turnout.engine.model.kv_cache import KVCacheSpec, MLAAttentionSpec
from turnout.engine.model.layers import GatedMLP, RMSNorm
from turnout.engine.model.llama import DecoderModel, PreNormDecoderLayer
from turnout.engine.model.mla import MLAAttention, mla_of
from turnout.engine.model.moe import SparseMoeBlock
from turnout.engine.model.moe_weights import moe_weight_shapes

FUSED_PARAMS: dict[str, tuple[str, ...]] = {"gate_up_proj": ("gate_proj", "up_proj")}


def is_moe_layer(config: ModelConfig, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` routes to experts (``MoEConfig.is_moe_layer``)."""
    return config.moe is not None and config.moe.is_moe_layer(layer_idx)


def _feed_forward(config: ModelConfig, layer_idx: int, backend: str) -> nn.Module:
    if config.moe is not None and is_moe_layer(config, layer_idx):
        return SparseMoeBlock(config.hidden_size, config.moe, backend)
    return GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)


class DeepseekV2DecoderLayer(PreNormDecoderLayer):
    def __init__(self, config: ModelConfig, layer_idx: int, backend: str) -> None:
        super().__init__()
        self.self_attn = MLAAttention(config, backend)
        self.mlp = _feed_forward(config, layer_idx, backend)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV2Body(nn.Module):
    """HF's ``model.`` prefix: embeddings, layers, final norm, the rotary tables."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        mla = mla_of(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DeepseekV2DecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = DeepseekRotaryEmbedding(
            mla.qk_rope_head_dim,
            config.rope_theta,
            mla.rope_scaling,
            config.max_position_embeddings,
        )


class DeepseekV2ForCausalLM(DecoderModel):
    """DeepSeek-V2 (and V2-Lite) over a paged latent cache; the interface of
    :class:`DecoderModel`."""

    #: MLA attention sizes its grid by the step's longest query (kernels/mla_attention.py):
    #: a graph captured for a token count would launch every query tile of it.
    MIXED_STEP_GRAPHS: ClassVar[bool] = False

    fused_params: ClassVar[dict[str, tuple[str, ...]]] = FUSED_PARAMS

    @classmethod
    def build_body(cls, config: ModelConfig, attn_backend: str) -> nn.Module:
        return DeepseekV2Body(config, attn_backend)

    @classmethod
    def kv_cache_spec_for(cls, config: ModelConfig) -> KVCacheSpec:
        """One latent row per token and layer: ``kv_lora_rank + qk_rope_head_dim`` values."""
        mla = mla_of(config)
        return MLAAttentionSpec(
            num_layers=config.num_hidden_layers,
            kv_lora_rank=mla.kv_lora_rank,
            qk_rope_head_dim=mla.qk_rope_head_dim,
        )

    @classmethod
    def hf_weight_shapes(cls, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        h = config.hidden_size
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (config.vocab_size, h),
            "model.norm.weight": (h,),
        }
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (config.vocab_size, h)
        for n in range(config.num_hidden_layers):
            p = f"model.layers.{n}."
            layer: dict[str, tuple[int, ...]] = {
                "input_layernorm.weight": (h,),
                "post_attention_layernorm.weight": (h,),
            }
            layer |= {f"self_attn.{k}": v for k, v in _attention_shapes(config).items()}
            layer |= {f"mlp.{k}": v for k, v in _feed_forward_shapes(config, n).items()}
            shapes |= {p + k: v for k, v in layer.items()}
        return shapes | moe_weight_shapes(config)


def _attention_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    mla, h, heads = mla_of(c), c.hidden_size, c.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {}
    if mla.q_lora_rank is None:
        shapes["q_proj.weight"] = (heads * mla.qk_head_dim, h)
    else:
        shapes |= {
            "q_a_proj.weight": (mla.q_lora_rank, h),
            "q_a_layernorm.weight": (mla.q_lora_rank,),
            "q_b_proj.weight": (heads * mla.qk_head_dim, mla.q_lora_rank),
        }
    shapes |= {
        "kv_a_proj_with_mqa.weight": (mla.latent_dim, h),
        "kv_a_layernorm.weight": (mla.kv_lora_rank,),
        "kv_b_proj.weight": (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
        "o_proj.weight": (h, heads * mla.v_head_dim),
    }
    if c.attention_bias:
        shapes |= {"kv_a_proj_with_mqa.bias": (mla.latent_dim,), "o_proj.bias": (h,)}
        if mla.q_lora_rank is not None:
            shapes["q_a_proj.bias"] = (mla.q_lora_rank,)
    return shapes


def _feed_forward_shapes(c: ModelConfig, layer_idx: int) -> dict[str, tuple[int, ...]]:
    if is_moe_layer(c, layer_idx):  # engine.model.moe_weights names those
        return {}
    h, i = c.hidden_size, c.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "gate_proj.weight": (i, h),
        "up_proj.weight": (i, h),
        "down_proj.weight": (h, i),
    }
    if c.mlp_bias:
        shapes |= {"gate_proj.bias": (i,), "up_proj.bias": (i,), "down_proj.bias": (h,)}
    return shapes
