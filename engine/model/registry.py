"""Which model class serves a decoder architecture. A class declares everything the loader and
the runners need of it: its body, fused parameters, checkpoint names and shapes, and the layout
of its paged KV cache (``DecoderModel``'s class methods)."""

from __future__ import annotations

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.deepseek_v2 import DeepseekV2ForCausalLM
from turnout.engine.model.jamba import JambaForCausalLM
from turnout.engine.model.llama import DecoderModel
from turnout.engine.model.mamba import MambaForCausalLM
from turnout.engine.model.opt import OPTDecoderModel
from turnout.engine.model.sequence_classification import LlamaForSequenceClassification

#: architecture -> its class; the Llama family (Llama, Mistral, Qwen2, Qwen3 and their MoE
#: relatives) is DecoderModel.
DECODER_CLASSES: dict[str, type[DecoderModel]] = {
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "OPTForCausalLM": OPTDecoderModel,
    "LlamaForSequenceClassification": LlamaForSequenceClassification,
    "MambaForCausalLM": MambaForCausalLM,
    "JambaForCausalLM": JambaForCausalLM,
}


def decoder_class(config: ModelConfig) -> type[DecoderModel]:
    """The model class of ``config``'s decoder architecture.

    Raises:
        ValueError: an encoder config.
    """
    if config.is_encoder:
        raise ValueError(f"{config.architecture} is an encoder: use EncoderModel")
    return DECODER_CLASSES.get(config.architecture, DecoderModel)


__all__ = ["DECODER_CLASSES", "decoder_class"]
