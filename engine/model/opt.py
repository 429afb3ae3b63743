"""OPT (Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models"):
``OPTForCausalLM`` over paged KV caches, plain PyTorch over packed tokens ``[T, ...]``.

Numerics follow transformers' ``models/opt/modeling_opt.py``:

- learned absolute positions, looked up at ``position + 2`` (``OPTLearnedPositionalEmbedding``
  keeps metaseq's offset of 2; the table has ``max_position_embeddings + 2`` rows); no RoPE;
- ``embed_tokens`` is ``[vocab, word_embed_proj_dim]``; when that differs from ``hidden_size``
  (opt-350m: 512 vs 1024) ``project_in`` maps token embeddings up before the positions are added
  and ``project_out`` maps the last hidden states down before the (tied) LM head;
- LayerNorm (eps 1e-5, ``nn.LayerNorm``'s default, which HF uses), before each block when
  ``do_layer_norm_before`` (pre-LN, opt-125m and the larger ones) or after each residual add
  (post-LN, opt-350m); the final LayerNorm exists only for pre-LN models without
  ``_remove_final_layer_norm``;
- multi-head attention (no GQA) with biases on q/k/v/out (``enable_bias``); queries are scaled
  by ``head_dim ** -0.5`` after the projection and attention runs with scale 1, as HF does;
- a ReLU MLP ``fc2(relu(fc1(x)))`` of width ``ffn_dim``.

Parameter names are HF's (``model.decoder.*``, ``lm_head.weight``) except the fused
``self_attn.qkv_proj = [q_proj; k_proj; v_proj]`` (``engine.model.llama.FUSED_PARAMS``).
Checkpoints saved without the ``model.`` prefix (``decoder.*``, as facebook/opt-* on the hub)
load too (:func:`opt_weight_names`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from turnout.engine.model.attention import paged_attention_forward
from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.config import ModelConfig, ModelConfigError, _common, _req
from turnout.engine.model.llama import DecoderModel

#: metaseq/HF OPT look positions up at ``position + POSITION_OFFSET``.
POSITION_OFFSET = 2
#: ``nn.LayerNorm``'s default epsilon, which every OPT LayerNorm uses (the config has no field).
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class OPTConfig:
    """The OPT fields of an HF ``OPTConfig`` that the shared :class:`ModelConfig` lacks.

    The shared fields carry the rest: ``intermediate_size`` is ``ffn_dim``, ``hidden_act`` is
    ``activation_function``, ``attention_bias``/``mlp_bias`` are ``enable_bias``,
    ``num_key_value_heads`` equals ``num_attention_heads``, ``layer_norm_eps`` is 1e-5.
    """

    word_embed_proj_dim: int
    do_layer_norm_before: bool = True
    remove_final_layer_norm: bool = False
    layer_norm_elementwise_affine: bool = True
    enable_bias: bool = True

    @property
    def has_final_layer_norm(self) -> bool:
        return self.do_layer_norm_before and not self.remove_final_layer_norm

    def to_hf_fields(self, config: ModelConfig) -> dict[str, Any]:
        """The HF ``config.json`` keys of these fields (for :meth:`ModelConfig.to_hf_dict`)."""
        return {
            "word_embed_proj_dim": self.word_embed_proj_dim,
            "do_layer_norm_before": self.do_layer_norm_before,
            "_remove_final_layer_norm": self.remove_final_layer_norm,
            "layer_norm_elementwise_affine": self.layer_norm_elementwise_affine,
            "enable_bias": self.enable_bias,
            "ffn_dim": config.intermediate_size,
            "activation_function": config.hidden_act,
        }


def opt_model_config(arch: str, d: Mapping[str, Any]) -> ModelConfig:
    """The :class:`ModelConfig` of an HF OPT ``config.json`` mapping (HF's defaults where a key
    is absent: tied embeddings, pre-LN, biases, ``word_embed_proj_dim = hidden_size``).

    Raises:
        ModelConfigError: a missing size, ``hidden_size`` not a multiple of the heads, or an
            ``activation_function`` other than ``relu``.
    """
    act = str(d.get("activation_function", "relu"))
    if act != "relu":
        raise ModelConfigError(f"activation_function {act!r}: OPTForCausalLM supports 'relu'")
    common = _common(arch, {**d, "intermediate_size": _req(d, "ffn_dim"), "hidden_act": act})
    hidden, heads = common["hidden_size"], common["num_attention_heads"]
    if hidden % heads:
        raise ModelConfigError(
            f"hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads})"
        )
    proj = _req(d, "word_embed_proj_dim") if d.get("word_embed_proj_dim") is not None else hidden
    bias = bool(d.get("enable_bias", True))
    opt = OPTConfig(
        word_embed_proj_dim=proj,
        do_layer_norm_before=bool(d.get("do_layer_norm_before", True)),
        remove_final_layer_norm=bool(d.get("_remove_final_layer_norm", False)),
        layer_norm_elementwise_affine=bool(d.get("layer_norm_elementwise_affine", True)),
        enable_bias=bias,
    )
    return ModelConfig(
        **common,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
        attention_bias=bias,
        mlp_bias=bias,
        layer_norm_eps=LAYER_NORM_EPS,
        opt=opt,
    )


def opt_weight_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of an ``OPTForCausalLM`` checkpoint."""
    assert c.opt is not None
    o, h, i, proj = c.opt, c.hidden_size, c.intermediate_size, c.opt.word_embed_proj_dim
    p = "model.decoder."
    shapes: dict[str, tuple[int, ...]] = {
        p + "embed_tokens.weight": (c.vocab_size, proj),
        p + "embed_positions.weight": (c.max_position_embeddings + POSITION_OFFSET, h),
    }
    if proj != h:
        shapes |= {p + "project_in.weight": (h, proj), p + "project_out.weight": (proj, h)}
    norms = ["self_attn_layer_norm", "final_layer_norm"]
    if o.has_final_layer_norm and o.layer_norm_elementwise_affine:
        shapes |= {p + "final_layer_norm.weight": (h,), p + "final_layer_norm.bias": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, proj)
    for n in range(c.num_hidden_layers):
        lp = f"{p}layers.{n}."
        for name, out_f, in_f in (
            ("self_attn.q_proj", h, h),
            ("self_attn.k_proj", h, h),
            ("self_attn.v_proj", h, h),
            ("self_attn.out_proj", h, h),
            ("fc1", i, h),
            ("fc2", h, i),
        ):
            shapes[f"{lp}{name}.weight"] = (out_f, in_f)
            if o.enable_bias:
                shapes[f"{lp}{name}.bias"] = (out_f,)
        if o.layer_norm_elementwise_affine:
            shapes |= {f"{lp}{norm}.{leaf}": (h,) for norm in norms for leaf in ("weight", "bias")}
    return shapes


def opt_weight_names(source: Mapping[str, Any]) -> dict[str, Any]:
    """``source`` with hub-style ``decoder.*`` names renamed to ``model.decoder.*``."""
    return {("model." + k if k.startswith("decoder.") else k): v for k, v in source.items()}


class OPTAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.backend = backend
        self.qkv_proj = nn.Linear(h, 3 * h, bias=config.attention_bias)
        self.out_proj = nn.Linear(h, h, bias=config.attention_bias)

    def forward(
        self, hidden: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:  # [T, h] -> [T, h]
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).chunk(3, dim=-1)
        shape = (num_tokens, self.num_heads, self.head_dim)
        # HF scales the projected queries and attends with scale 1 (modeling_opt.py).
        q = (q * self.scaling).reshape(shape)
        out = paged_attention_forward(
            q,
            k.reshape(shape),
            v.reshape(shape),
            kv_cache,
            attn_metadata,
            scale=1.0,
            backend=self.backend,
        )
        projected: torch.Tensor = self.out_proj(out.view(num_tokens, -1))
        return projected


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        assert config.opt is not None
        h, affine = config.hidden_size, config.opt.layer_norm_elementwise_affine
        self.pre_ln = config.opt.do_layer_norm_before
        self.self_attn = OPTAttention(config, backend)
        self.self_attn_layer_norm = nn.LayerNorm(h, eps=LAYER_NORM_EPS, elementwise_affine=affine)
        self.fc1 = nn.Linear(h, config.intermediate_size, bias=config.mlp_bias)
        self.fc2 = nn.Linear(config.intermediate_size, h, bias=config.mlp_bias)
        self.final_layer_norm = nn.LayerNorm(h, eps=LAYER_NORM_EPS, elementwise_affine=affine)

    def forward(
        self, hidden: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        x = self.self_attn_layer_norm(hidden) if self.pre_ln else hidden
        hidden = hidden + self.self_attn(x, kv_cache, attn_metadata)
        if not self.pre_ln:
            hidden = self.self_attn_layer_norm(hidden)
        x = self.final_layer_norm(hidden) if self.pre_ln else hidden
        hidden = hidden + self.fc2(F.relu(self.fc1(x)))
        return hidden if self.pre_ln else self.final_layer_norm(hidden)


class OPTDecoder(nn.Module):
    """HF's ``model.decoder``: embeddings, optional projections, layers, final LayerNorm."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        assert config.opt is not None
        o, h = config.opt, config.hidden_size
        proj = o.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, proj)
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, h)
        self.project_in = nn.Linear(proj, h, bias=False) if proj != h else None
        self.project_out = nn.Linear(h, proj, bias=False) if proj != h else None
        self.final_layer_norm = (
            nn.LayerNorm(h, eps=LAYER_NORM_EPS, elementwise_affine=o.layer_norm_elementwise_affine)
            if o.has_final_layer_norm
            else None
        )
        self.layers = nn.ModuleList(
            OPTDecoderLayer(config, backend) for _ in range(config.num_hidden_layers)
        )


class _OPTBody(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config, backend)


class OPTDecoderModel(DecoderModel):
    """``OPTForCausalLM``: the :class:`DecoderModel` interface (``forward``,
    ``compute_logits``, ``config``) over OPT's own body, so both runners serve it unchanged.

    ``forward`` returns ``[T, word_embed_proj_dim]`` (after ``project_out``), which is what the
    LM head reads; that is ``hidden_size`` unless the model projects.
    """

    def __init__(self, config: ModelConfig, attn_backend: str = "auto") -> None:
        if config.opt is None:
            raise ValueError(f"{config.architecture} is not an OPT config")
        nn.Module.__init__(self)  # DecoderModel.__init__ would build a Llama body
        self.config = config
        self.model = _OPTBody(config, attn_backend)
        self.lm_head = nn.Linear(config.opt.word_embed_proj_dim, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.decoder.embed_tokens.weight

    @classmethod
    def hf_weight_shapes(cls, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        return opt_weight_shapes(config)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, block_size, H, head_dim]
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, word_embed_proj_dim], model dtype
        """Run every layer over the step's packed tokens (see :class:`DecoderModel`).

        Raises:
            ValueError: ``kv_caches`` does not hold one cache per layer.
        """
        dec = self.model.decoder
        if len(kv_caches) != len(dec.layers):
            raise ValueError(f"expected {len(dec.layers)} KV caches, got {len(kv_caches)}")
        hidden: torch.Tensor = dec.embed_tokens(input_ids)
        if dec.project_in is not None:
            hidden = dec.project_in(hidden)
        hidden = hidden + dec.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(dec.layers, kv_caches, strict=True):
            hidden = layer(hidden, kv_cache, attn_metadata)
        if dec.final_layer_norm is not None:
            hidden = dec.final_layer_norm(hidden)
        if dec.project_out is not None:
            hidden = dec.project_out(hidden)
        return hidden
