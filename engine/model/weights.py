"""Weights: HF tensor names and shapes per architecture, assignment into a model built on the
meta device (each parameter allocated once, at its final dtype and device: gpt-fast's way),
and seeded random weights.

A *weight source* is a mapping ``hf_name -> () -> torch.Tensor`` (a safetensors directory, a
GGUF file, or a random generator); tensors are read only when assigned.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Mapping

import torch
from torch import nn

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.moe_weights import Recipe, moe_weight_shapes

WeightSource = Mapping[str, Callable[[], torch.Tensor]]

# HF names that carry nothing the model needs (rotary tables are recomputed; the BERT pooler is
# not part of mean pooling). Everything else unexpected is an error.
IGNORED_SUFFIXES = (
    "rotary_emb.inv_freq",
    "embeddings.position_ids",
    "pooler.dense.weight",
    "pooler.dense.bias",
)


class WeightLoadError(ValueError):
    """The weights do not fit the architecture (missing, unexpected or mis-shaped tensors)."""


def decoder_weight_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a decoder checkpoint (Llama/Mistral/Qwen2/Qwen3, and the
    MoE families: their sparse layers' tensors come from ``engine.model.moe_weights``)."""
    h, q, kv, i = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        c.intermediate_size,
    )
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        layer = {
            "self_attn.q_proj.weight": (q, h),
            "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q),
            "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
        }
        if c.moe is None or not c.moe.is_moe_layer(n):  # a dense MLP
            layer |= {
                "mlp.gate_proj.weight": (i, h),
                "mlp.up_proj.weight": (i, h),
                "mlp.down_proj.weight": (h, i),
            }
        if c.qkv_bias:
            layer |= {
                "self_attn.q_proj.bias": (q,),
                "self_attn.k_proj.bias": (kv,),
                "self_attn.v_proj.bias": (kv,),
            }
        if c.o_proj_bias:
            layer["self_attn.o_proj.bias"] = (h,)
        if c.mlp_bias:
            layer |= {
                "mlp.gate_proj.bias": (i,),
                "mlp.up_proj.bias": (i,),
                "mlp.down_proj.bias": (h,),
            }
        if c.has_qk_norm:
            layer |= {
                "self_attn.q_norm.weight": (c.head_dim,),
                "self_attn.k_norm.weight": (c.head_dim,),
            }
        shapes |= {p + k: v for k, v in layer.items()}
    return shapes | moe_weight_shapes(c)


def bert_weight_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a ``BertModel`` checkpoint (pooler excluded), or of a
    ``BertForSequenceClassification`` one (the encoder under ``bert.``, its pooler, and
    ``classifier``)."""
    h, i = c.hidden_size, c.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (c.vocab_size, h),
        "embeddings.position_embeddings.weight": (c.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": (c.type_vocab_size, h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for n in range(c.num_hidden_layers):
        p = f"encoder.layer.{n}."
        for name, out_f, in_f in (
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", i, h),
            ("output.dense", h, i),
        ):
            shapes[f"{p}{name}.weight"] = (out_f, in_f)
            shapes[f"{p}{name}.bias"] = (out_f,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}{norm}.weight"] = (h,)
            shapes[f"{p}{norm}.bias"] = (h,)
    if c.classifier is None:
        return shapes
    n = c.classifier.num_labels
    return {f"bert.{k}": v for k, v in shapes.items()} | {
        "bert.pooler.dense.weight": (h, h),
        "bert.pooler.dense.bias": (h,),
        "classifier.weight": (n, h),
        "classifier.bias": (n,),
    }


def hf_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of ``config``'s architecture (a decoder's are declared by its
    model class, ``engine.model.registry``)."""
    if config.is_encoder:
        return bert_weight_shapes(config)
    from turnout.engine.model.registry import decoder_class  # the model classes import this module

    return decoder_class(config).hf_weight_shapes(config)


def random_tensor(
    name: str, shape: tuple[int, ...], seed: int, device: str = "cpu"
) -> torch.Tensor:
    """A float32 tensor on ``device`` that depends only on ``(seed, name, shape, device type)``:
    drawn by that device's generator, so CUDA-drawn values differ from CPU-drawn ones.

    Norm weights ``1 + 0.1 N(0,1)``, biases ``0.02 N(0,1)``, embeddings ``N(0,1)``, projection
    matrices ``N(0, 1/fan_in)`` (fan-in: the last dimension, also of stacked experts): logits of a small model then have spread, so greedy parity
    tests compare clear choices rather than near-ties.
    """
    gen = torch.Generator(device=device).manual_seed(
        (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)
    )
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
    if name.endswith(".bias"):
        return x * 0.02
    if len(shape) == 1:
        return 1.0 + 0.1 * x
    if "embed" in name:
        return x
    scale: float = shape[-1] ** 0.5
    return x / scale


def random_source(config: ModelConfig, seed: int, device: str = "cpu") -> WeightSource:
    """Seeded random weights under HF names, drawn on ``device`` (see :func:`random_tensor`)."""
    return {
        name: functools.partial(random_tensor, name, shape, seed, device)
        for name, shape in hf_weight_shapes(config).items()
    }


def assign_weights(
    model: nn.Module,
    source: WeightSource,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    fused: Mapping[str, tuple[str, ...]],
    prefix_aliases: tuple[str, ...] = (),
    recipes: Mapping[str, Recipe] | None = None,
    shard: Callable[[str, int, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Fill every parameter of ``model`` (built on the meta device) from ``source``.

    Each parameter is materialised on ``device`` once, at ``dtype``; fused parameters
    (``fused``: name part -> HF parts) are concatenated from their pieces along dim 0;
    parameters named in ``recipes`` (``engine.model.moe_weights``: stacked experts) are
    allocated on ``device`` and filled piece by piece. HF names may carry one of
    ``prefix_aliases`` (e.g. ``"bert."``). ``shard(param name, piece index, tensor)`` cuts each
    HF piece, read on the host, to a tensor-parallel rank's part before the pieces are joined
    (``engine.model.parallel_layers.weight_sharder``).

    Raises:
        WeightLoadError: a parameter has no tensor, a tensor has the wrong shape, or the source
            holds tensors the model does not use (all named in the message).
    """
    names = _strip_prefixes(source, prefix_aliases)
    used: set[str] = set()
    missing: list[str] = []
    for pname, param in list(model.named_parameters(remove_duplicate=True)):
        if not param.is_meta:  # filled by a format's own loader (engine.model.fp8)
            continue
        if recipes is not None and pname in recipes:
            recipe = recipes[pname]
            absent = [name for _, name, _ in recipe if name not in names]
            if absent:
                missing += absent
                continue
            _set_param(
                model,
                pname,
                nn.Parameter(
                    _assemble(pname, param.shape, recipe, names, dtype, device), requires_grad=False
                ),
            )
            used.update(name for _, name, _ in recipe)
            continue
        parts = _hf_parts(pname, fused)
        if any(p not in names for p in parts):
            missing += [p for p in parts if p not in names]
            continue
        # Fused pieces are joined on the host, so the device holds each parameter once.
        pieces = [_read(names[p], p, dtype) for p in parts]
        if shard is not None:
            pieces = [shard(pname, i, piece) for i, piece in enumerate(pieces)]
        tensor = (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)).to(device)
        if tensor.shape != param.shape:
            raise WeightLoadError(
                f"{pname}: checkpoint shape {tuple(tensor.shape)} != "
                f"model shape {tuple(param.shape)}"
            )
        _set_param(model, pname, nn.Parameter(tensor, requires_grad=False))
        used.update(parts)
    if missing:
        raise WeightLoadError(f"checkpoint lacks {len(missing)} tensors: {', '.join(missing[:8])}")
    unexpected = sorted(n for n in names if n not in used and not n.endswith(IGNORED_SUFFIXES))
    if unexpected:
        raise WeightLoadError(
            f"checkpoint has {len(unexpected)} tensors this architecture does "
            f"not use: {', '.join(unexpected[:8])}"
        )


def _assemble(
    pname: str,
    shape: torch.Size,
    recipe: Recipe,
    names: Mapping[str, Callable[[], torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    # One allocation at the final place; each piece passes through the host on its own.
    out = torch.empty(shape, dtype=dtype, device=device)
    for index, name, _ in recipe:
        piece = _read(names[name], name, dtype)
        target = out[index]
        if piece.shape != target.shape:
            raise WeightLoadError(
                f"{name}: checkpoint shape {tuple(piece.shape)} != "
                f"{tuple(target.shape)} expected for its part of {pname}"
            )
        target.copy_(piece)
    return out


def _strip_prefixes(
    source: WeightSource, prefixes: tuple[str, ...]
) -> dict[str, Callable[[], torch.Tensor]]:
    out: dict[str, Callable[[], torch.Tensor]] = {}
    for name, get in source.items():
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        out[name] = get
    return out


def _hf_parts(pname: str, fused: Mapping[str, tuple[str, ...]]) -> list[str]:
    module, _, leaf = pname.rpartition(".")
    head, _, last = module.rpartition(".")
    if last in fused:
        return [f"{head}.{part}.{leaf}" for part in fused[last]]
    return [pname]


def _read(get: Callable[[], torch.Tensor], name: str, dtype: torch.dtype) -> torch.Tensor:
    tensor = get()
    if not tensor.is_floating_point():
        raise WeightLoadError(f"{name}: expected a floating-point tensor, got {tensor.dtype}")
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # casting would drop its scale
        raise WeightLoadError(
            f"{name}: an FP8 tensor, but the config's quantization_config does "
            "not make this layer FP8"
        )
    return tensor.to(dtype=dtype).contiguous()


def _set_param(model: nn.Module, pname: str, param: nn.Parameter) -> None:
    module_name, _, leaf = pname.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    setattr(module, leaf, param)
