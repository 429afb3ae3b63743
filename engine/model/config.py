"""ModelConfig: the architecture facts the model layer needs, with Hugging Face field names.

Built from a ``config.json`` mapping (:meth:`ModelConfig.from_hf_dict`) or from GGUF metadata
(``engine.model.gguf_loader``). Both spellings of RoPE settings are read: the legacy
``rope_theta`` + ``rope_scaling`` pair (transformers < 5) and ``rope_parameters`` (transformers
5). Anything the layer cannot honour (an unknown architecture, a RoPE type without an
implementation, Qwen2/Qwen3 layer-wise sliding windows) is refused with
:class:`ModelConfigError` naming the field, never ignored.

Family facts live in nested values rather than flat fields: ``moe`` (an
:class:`~engine.model.moe_config.MoEConfig`, for the MoE architectures), ``granite``
(:class:`~engine.model.granite_config.GraniteMultipliers`), ``mla``
(:class:`~engine.model.deepseek_v2_config.MLAConfig`, DeepSeek-V2's latent attention) and
``mamba`` (:class:`~engine.model.mamba_config.MambaConfig`, the Mamba layers of Mamba and Jamba).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # family- and format-specific parts live in their own modules
    from turnout.engine.model.deepseek_v2_config import MLAConfig
    from turnout.engine.model.fp8_config import Fp8Config
    from turnout.engine.model.gguf_loader import GGUFQuantization
    from turnout.engine.model.opt import OPTConfig

from turnout.engine.model.granite_config import GRANITE_ARCHITECTURES, GraniteMultipliers
from turnout.engine.model.mamba_config import (
    DEFAULT_MAX_MODEL_LEN,
    MAMBA_ARCHITECTURES,
    MambaConfig,
    mamba_model_config,
)
from turnout.engine.model.moe_config import MOE_FAMILIES, MoEConfig
from turnout.engine.model.pooling_config import (
    EMBEDDING_ARCHITECTURES,
    POOLING_DECODER_ARCHITECTURES,
    SEQUENCE_CLASSIFICATION_ARCHITECTURES,
    ClassifierConfig,
    bert_model_config,
    pooling_tasks_of,
)

DECODER_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "OPTForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "GraniteMoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "MambaForCausalLM",
    "JambaForCausalLM",
    *POOLING_DECODER_ARCHITECTURES,
)
ENCODER_ARCHITECTURES = (*EMBEDDING_ARCHITECTURES, "BertForSequenceClassification")
SUPPORTED_ARCHITECTURES = DECODER_ARCHITECTURES + ENCODER_ARCHITECTURES
#: Architectures served with ``runner_kind="pooling"`` (encoders and sequence classifiers).
POOLING_ARCHITECTURES = ENCODER_ARCHITECTURES + POOLING_DECODER_ARCHITECTURES

_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "OPTForCausalLM": "opt",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GraniteMoeForCausalLM": "granitemoe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "MambaForCausalLM": "mamba",
    "JambaForCausalLM": "jamba",
    "BertModel": "bert",
    "BertForSequenceClassification": "bert",
    "LlamaForSequenceClassification": "llama",
}
# q/k/v biases always, no o_proj bias (transformers' Qwen2 and Qwen2-MoE attention)
_QWEN2_ATTENTION = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")
_MOE_DECODERS = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GraniteMoeForCausalLM")
_QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_QWEN_SLIDING = (
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
)
# RoPE types with an implementation in engine.model.layers (HF `rope_type` names).
ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(ValueError):
    """A config the model layer cannot serve; the message names the field and what to change."""


@dataclass(frozen=True)
class RopeScaling:
    """HF ``rope_scaling`` / ``rope_parameters`` beyond ``rope_theta``.

    ``llama3``: Llama 3.1's frequency-dependent scaling (meta-llama/llama-models
    ``apply_scaling``; vLLM PR #6553). ``linear``: positions divided by ``factor``
    (Chen et al. 2023, "Extending Context Window ... via Positional Interpolation").
    """

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one supported model (frozen, hashable). Field names are HF's.

    ``head_dim`` is always explicit (Qwen3 sets it apart from ``hidden_size //
    num_attention_heads``). ``eos_token_id`` is the first end-of-sequence id and
    ``eos_token_ids`` all of them (HF configs may give a list). Decoder-only fields are
    ignored by the BERT encoder and vice versa (``layer_norm_eps``, ``type_vocab_size``).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    model_type: str = ""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (and o_proj except for Qwen2)
    mlp_bias: bool = False
    sliding_window: int | None = None  # Mistral: every layer attends to the last N tokens
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    layer_norm_eps: float = 1e-12
    type_vocab_size: int = 2
    opt: OPTConfig | None = None  # OPT's own fields (engine.model.opt)
    # FP8 checkpoints (engine.model.fp8_config) or a GGUF file's quantization types
    quantization: Fp8Config | GGUFQuantization | None = None
    moe: MoEConfig | None = None  # the MoE architectures (engine/model/moe_config.py)
    granite: GraniteMultipliers | None = None  # GraniteMoe's multipliers
    # DeepSeek-V2's latent attention (engine/model/deepseek_v2_config.py); None for the others
    mla: MLAConfig | None = None
    # the Mamba mixer of Mamba and Jamba (engine/model/mamba_config.py); None for the others
    mamba: MambaConfig | None = None
    # a sequence-classification head (engine/model/pooling_config.py); None for the others
    classifier: ClassifierConfig | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False, hash=False)

    @property
    def is_encoder(self) -> bool:
        """True for the BERT encoders (pooling), False for the decoders."""
        return self.architecture in ENCODER_ARCHITECTURES

    @property
    def has_inner_state(self) -> bool:
        """True for models with per-request recurrent state (Mamba layers): they keep a state
        cache beside the paged KV cache and cannot reuse cached prefixes."""
        return self.mamba is not None

    @property
    def is_pooling(self) -> bool:
        """True for the architectures served with ``runner_kind="pooling"``."""
        return self.architecture in POOLING_ARCHITECTURES

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        """vLLM pooling task names this model serves (empty for a generating model)."""
        return pooling_tasks_of(self.architecture, self.classifier, self.type_vocab_size)

    @property
    def has_qk_norm(self) -> bool:
        """Qwen3 (and Qwen3-MoE) normalise q and k per head (RMSNorm over head_dim) before RoPE."""
        return self.architecture in _QK_NORM

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 and Qwen2-MoE always have q/k/v biases; the others follow ``attention_bias``."""
        return self.architecture in _QWEN2_ATTENTION or self.attention_bias

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.architecture not in _QWEN2_ATTENTION

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build from an HF ``config.json`` mapping.

        Raises:
            ModelConfigError: unsupported architecture, a missing or invalid field, or a
                feature the layer does not implement (named in the message).
        """
        arch = _architecture(d)
        if arch in ENCODER_ARCHITECTURES:
            config = _bert_config(arch, d)
        elif arch == "OPTForCausalLM":
            from turnout.engine.model.opt import opt_model_config

            config = opt_model_config(arch, d)
        elif arch in MAMBA_ARCHITECTURES:
            config = _mamba_config(arch, d)
        elif arch == "DeepseekV2ForCausalLM":  # its attention fields are read in their own module
            from turnout.engine.model.deepseek_v2_config import read_mla_config

            mla, flat = read_mla_config(d)
            config = replace(_decoder_config(arch, flat), mla=mla)
        else:
            config = _decoder_config(arch, d)
        if arch in SEQUENCE_CLASSIFICATION_ARCHITECTURES:
            config = replace(config, classifier=ClassifierConfig.from_hf_dict(d))
        if d.get("quantization_config") is None:
            return config
        from turnout.engine.model.fp8_config import parse_quantization_config

        return replace(
            config, quantization=parse_quantization_config(config, d["quantization_config"])
        )

    @property
    def quantization_method(self) -> str:
        """vLLM's ``--quantization`` name of the weights (``"none"``, ``"fp8"``,
        ``"compressed-tensors"``, ``"gguf"``): the value reported to the oracle."""
        return self.quantization.method if self.quantization is not None else "none"

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF ``config.json`` mapping (legacy RoPE spelling, which every version reads)."""
        d = {
            k: v
            for k, v in asdict(self).items()
            if k
            not in (
                "architecture",
                "extra",
                "opt",
                "quantization",
                "moe",
                "granite",
                "mla",
                "mamba",
                "classifier",
            )
        }
        d = {**dict(self.extra), **d}
        if self.opt is not None:
            d |= self.opt.to_hf_fields(self)
        if self.quantization is not None and hasattr(self.quantization, "to_hf_dict"):
            d["quantization_config"] = self.quantization.to_hf_dict()  # GGUF has no HF form
        for nested in (self.moe, self.granite, self.classifier):
            if nested is not None:
                d |= nested.to_hf_dict()
        d["architectures"] = [self.architecture]
        d["eos_token_id"] = (
            list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else (self.eos_token_id)
        )
        d.pop("eos_token_ids")
        d["rope_scaling"] = asdict(self.rope_scaling) if self.rope_scaling else None
        if self.mla is not None:
            d.update(self.mla.to_hf_dict())
        if self.is_encoder:
            d["layer_norm_eps"] = self.layer_norm_eps
            for key in (
                "rms_norm_eps",
                "rope_theta",
                "rope_scaling",
                "head_dim",
                "sliding_window",
                "num_key_value_heads",
                "tie_word_embeddings",
            ):
                d.pop(key, None)
        return d


def _architecture(d: Mapping[str, Any]) -> str:
    archs = d.get("architectures")
    if not archs or not isinstance(archs, list | tuple):
        raise ModelConfigError("config has no `architectures` list; pass a HF config.json")
    arch = str(archs[0])
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelConfigError(
            f"architecture {arch!r} is not supported by the model layer; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _req(d: Mapping[str, Any], key: str) -> int:
    if key not in d or d[key] is None:
        raise ModelConfigError(f"config field `{key}` is required")
    value = d[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelConfigError(f"config field `{key}` must be a positive integer, got {value!r}")
    return value


def _eos(d: Mapping[str, Any]) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    if eos is None:
        return ()
    ids = list(eos) if isinstance(eos, list | tuple) else [eos]
    if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in ids):
        raise ModelConfigError(
            f"config field `eos_token_id` must be a token id or a list of them, got {eos!r}"
        )
    return tuple(ids)


def _common(arch: str, d: Mapping[str, Any]) -> dict[str, Any]:
    eos = _eos(d)
    known = {f for f in ModelConfig.__dataclass_fields__}
    return dict(
        architecture=arch,
        model_type=str(d.get("model_type") or _MODEL_TYPES[arch]),
        vocab_size=_req(d, "vocab_size"),
        hidden_size=_req(d, "hidden_size"),
        intermediate_size=_req(d, "intermediate_size"),
        num_hidden_layers=_req(d, "num_hidden_layers"),
        num_attention_heads=_req(d, "num_attention_heads"),
        max_position_embeddings=_req(d, "max_position_embeddings"),
        hidden_act=str(d.get("hidden_act", "silu")),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=eos[0] if eos else None,
        eos_token_ids=eos,
        pad_token_id=d.get("pad_token_id"),
        torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        extra=tuple(
            sorted(
                (k, v)
                for k, v in d.items()
                if k not in known and k != "architectures" and _hashable(v)
            )
        ),
    )


def _hashable(v: Any) -> bool:
    return isinstance(v, str | int | float | bool) or v is None


def _decoder_config(arch: str, d: Mapping[str, Any]) -> ModelConfig:
    common = _common(arch, d)
    num_heads = common["num_attention_heads"]
    num_kv_heads = (
        _req(d, "num_key_value_heads") if d.get("num_key_value_heads") is not None else num_heads
    )
    if num_heads % num_kv_heads:
        raise ModelConfigError(
            f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads "
            f"({num_kv_heads})"
        )
    head_dim = (
        _req(d, "head_dim") if d.get("head_dim") is not None else common["hidden_size"] // num_heads
    )
    if common["hidden_act"] != "silu":
        raise ModelConfigError(f"hidden_act {common['hidden_act']!r}: decoders support 'silu'")
    rope_theta, rope_scaling = _rope(d)
    _check_moe_fields(arch, d)
    return ModelConfig(
        **common,
        num_key_value_heads=num_kv_heads,
        head_dim=int(head_dim),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)),
        sliding_window=_sliding_window(arch, d),
        moe=MoEConfig.from_hf_dict(
            d, architecture=arch, num_hidden_layers=common["num_hidden_layers"]
        )
        if arch in MOE_FAMILIES
        else None,
        granite=GraniteMultipliers.from_hf_dict(d) if arch in GRANITE_ARCHITECTURES else None,
    )


def _mamba_config(arch: str, d: Mapping[str, Any]) -> ModelConfig:
    # HF's MambaConfig has no attention heads and no maximum length (vLLM's default applies);
    # Jamba's has both (its attention layers' fields are read in engine.model.mamba_config).
    filled = dict(d)
    if arch == "MambaForCausalLM":
        filled = {"num_attention_heads": 1, "max_position_embeddings": DEFAULT_MAX_MODEL_LEN, **d}
        filled.setdefault("intermediate_size", 2 * _req(d, "hidden_size"))
    common = _common(arch, filled)
    return ModelConfig(**common, **mamba_model_config(arch, d, common))


def _check_moe_fields(arch: str, d: Mapping[str, Any]) -> None:
    # transformers 5 made Qwen2-MoE's q/k/v bias a config key (`qkv_bias`, default true);
    # every released checkpoint has the biases.
    if arch == "Qwen2MoeForCausalLM" and d.get("qkv_bias", True) is not True:
        raise ModelConfigError(
            "qkv_bias must be true for Qwen2MoeForCausalLM (q/k/v biases); "
            f"got {d.get('qkv_bias')!r}"
        )
    # Their MLPs and experts have no biases in transformers, whatever the key says.
    if arch in _MOE_DECODERS and d.get("mlp_bias"):
        raise ModelConfigError(
            f"mlp_bias is not supported for {arch}: its MLPs and experts have no bias"
        )


def _sliding_window(arch: str, d: Mapping[str, Any]) -> int | None:
    window = d.get("sliding_window")
    if arch in _QWEN_SLIDING:
        if d.get("use_sliding_window"):
            raise ModelConfigError(
                "use_sliding_window=true (Qwen layer-wise sliding window) is not supported; "
                "set it to false"
            )
        return None
    if arch in ("LlamaForCausalLM", "GraniteMoeForCausalLM", *POOLING_DECODER_ARCHITECTURES):
        return None
    return int(window) if window else None


def _rope(d: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    params = d.get("rope_parameters")
    if isinstance(params, Mapping):  # transformers >= 5: theta and scaling in one mapping
        theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling: Mapping[str, Any] | None = params
    else:
        theta = d.get("rope_theta", 10000.0)
        scaling = d.get("rope_scaling")
    theta = float(theta)
    if not math.isfinite(theta) or theta <= 0:
        raise ModelConfigError(f"rope_theta must be positive, got {theta!r}")
    if not scaling:
        return theta, None
    rope_type = str(scaling.get("rope_type") or scaling.get("type") or "default")
    if rope_type not in ROPE_TYPES:
        raise ModelConfigError(
            f"rope_scaling type {rope_type!r} is not implemented; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    defaults = RopeScaling(rope_type)
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(scaling.get("factor", 1.0)),
        low_freq_factor=float(scaling.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(scaling.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            scaling.get(
                "original_max_position_embeddings", defaults.original_max_position_embeddings
            )
        ),
    )


def _bert_config(arch: str, d: Mapping[str, Any]) -> ModelConfig:
    common = _common(arch, d)
    return ModelConfig(**common, **bert_model_config(arch, d, common))
