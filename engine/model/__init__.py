"""The model layer shared by both runners: decoders of the Llama family and OPT, a BERT
encoder, attention over paged KV caches, and weight loading (HF safetensors directories, FP8
checkpoints, GGUF). See docs/model-layer.md for the interface."""

from engine.model.attention_metadata import AttentionMetadata
from engine.model.bert import EncoderModel
from engine.model.config import ModelConfig, ModelConfigError, RopeScaling
from engine.model.kv_cache import allocate_kv_caches, kv_cache_bytes_per_block
from engine.model.llama import DecoderModel
from engine.model.loader import load_model
from engine.model.random_weights import write_random_weights
from engine.model.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from engine.model.weights import WeightLoadError

__all__ = [
    "AttentionMetadata",
    "DecoderModel",
    "EncoderModel",
    "ModelConfig",
    "ModelConfigError",
    "RopeScaling",
    "Tokenizer",
    "TokenizerError",
    "WeightLoadError",
    "allocate_kv_caches",
    "kv_cache_bytes_per_block",
    "load_model",
    "load_tokenizer",
    "write_random_weights",
]
