"""The model layer shared by both runners: decoders of the Llama family (with their
mixture-of-experts relatives), OPT, DeepSeek-V2 (multi-head latent attention and
DeepSeekMoE), Mamba and the Jamba hybrid (per-request state beside the KV cache), a BERT
encoder (embeddings, sequence classification), the Llama body with a sequence-classification
head (reward models), attention over paged KV caches, and weight loading (HF safetensors
directories, FP8 checkpoints, GGUF). See docs/model-layer.md for the interface."""

from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.bert import BertForSequenceClassification, EncoderModel
from turnout.engine.model.config import ModelConfig, ModelConfigError, RopeScaling
from turnout.engine.model.deepseek_v2 import DeepseekV2ForCausalLM
from turnout.engine.model.kv_cache import (
    FullAttentionSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    kv_cache_spec,
)
from turnout.engine.model.llama import DecoderModel
from turnout.engine.model.loader import load_model
from turnout.engine.model.moe import MoEConfig, SparseMoeBlock, select_experts
from turnout.engine.model.random_weights import write_random_weights
from turnout.engine.model.sequence_classification import LlamaForSequenceClassification
from turnout.engine.model.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from turnout.engine.model.weights import WeightLoadError

__all__ = [
    "AttentionMetadata",
    "BertForSequenceClassification",
    "DecoderModel",
    "DeepseekV2ForCausalLM",
    "EncoderModel",
    "FullAttentionSpec",
    "KVCacheSpec",
    "LlamaForSequenceClassification",
    "MLAAttentionSpec",
    "MoEConfig",
    "ModelConfig",
    "ModelConfigError",
    "RopeScaling",
    "SparseMoeBlock",
    "Tokenizer",
    "TokenizerError",
    "WeightLoadError",
    "allocate_kv_caches",
    "kv_cache_bytes_per_block",
    "kv_cache_spec",
    "load_model",
    "load_tokenizer",
    "select_experts",
    "write_random_weights",
]
