"""Writing FP8 checkpoints from dense weights, with each format's own rule, and reading them
back densely (the reference HF transformers loads in parity tests).

The rule (vLLM's ``scaled_fp8_quant``, compressed-tensors' symmetric min-max observer):
``scale = amax(|w|) / 448`` over the tensor, each output row (channel) or each
``block_n x block_k`` block, and ``q = clamp(w / scale, -448, 448)`` rounded to
``float8_e4m3fn``. A static input scale is ``amax(|x|) / 448`` of the layer's calibration
inputs (:func:`calibrate_input_amax`). Tensor names and shapes are the formats' own (see
``engine.model.fp8_config``): the fp8 method stores scalar ``weight_scale`` / ``input_scale``
and block scales as ``weight_scale_inv``; compressed-tensors stores ``[1]`` per tensor,
``[out, 1]`` per channel.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.fp8 import dequantize_fp8
from turnout.engine.model.fp8_config import Fp8Config, Fp8Scheme
from turnout.kernels.fp8_quant import FP8_DTYPE, FP8_MAX, MIN_SCALE


def quantize_fp8_weight(
    weight: torch.Tensor,
    scheme: Fp8Scheme,  # [N, K] float
) -> tuple[torch.Tensor, torch.Tensor]:  # [N, K] fp8, scale float32
    """``(q, scale)`` of ``weight`` by the rule above; ``scale`` is ``[]`` (tensor), ``[N, 1]``
    (channel) or ``[ceil(N/bn), ceil(K/bk)]`` (block)."""
    w = weight.float()
    if scheme.weight_strategy == "tensor":
        scale = (w.abs().amax() / FP8_MAX).clamp(min=MIN_SCALE)
        full = scale
    elif scheme.weight_strategy == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
        full = scale
    else:
        assert scheme.weight_block_size is not None
        bn, bk = scheme.weight_block_size
        n, k = w.shape
        padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk, device=w.device)
        padded[:n, :k] = w.abs()
        blocks = padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
        scale = (blocks.amax(dim=(1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)
        full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def linear_weight_names(config: ModelConfig, names: Iterable[str]) -> list[str]:
    """HF module names of the linear layers among tensor ``names`` (2-D ``*.weight`` that are
    not embeddings), e.g. ``model.layers.0.self_attn.q_proj``."""
    from turnout.engine.model.weights import hf_weight_shapes

    shapes = hf_weight_shapes(config)
    return [
        n.removesuffix(".weight")
        for n in names
        if n.endswith(".weight") and len(shapes.get(n, ())) == 2 and "embed" not in n
    ]


def quantize_tensors(
    tensors: Mapping[str, Callable[[], torch.Tensor]],
    config: ModelConfig,
    input_amax: Mapping[str, float] | None = None,
) -> dict[str, Callable[[], torch.Tensor]]:
    """The FP8 checkpoint of dense HF-named ``tensors`` (lazy, like a weight source) under
    ``config.quantization``: layers it quantises get ``weight`` (fp8) and their scales; the
    rest is unchanged.

    Raises:
        ValueError: ``config`` is not FP8, or a static scheme without ``input_amax`` for a layer.
    """
    q = config.quantization
    if not isinstance(q, Fp8Config):
        raise ValueError("quantize_tensors needs a config with an FP8 quantization_config")
    out = dict(tensors)
    for module in linear_weight_names(config, tensors):
        scheme = q.scheme_for(module)
        if scheme is None or (module == "lm_head" and config.tie_word_embeddings):
            continue
        get = out[module + ".weight"]

        def weight(g: Callable[[], torch.Tensor] = get, s: Fp8Scheme = scheme) -> torch.Tensor:
            return quantize_fp8_weight(g(), s)[0]

        def scale(g: Callable[[], torch.Tensor] = get, s: Fp8Scheme = scheme) -> torch.Tensor:
            return _stored_scale(quantize_fp8_weight(g(), s)[1], s, q.method)

        out[module + ".weight"] = weight
        out[f"{module}.{q.scale_name}"] = scale
        if scheme.activation == "static":
            if input_amax is None or module not in input_amax:
                raise ValueError(
                    f"{module}: a static scheme needs its calibration amax (input_amax)"
                )
            value = max(float(input_amax[module]) / FP8_MAX, MIN_SCALE)
            shape = () if q.method == "fp8" else (1,)
            out[module + ".input_scale"] = functools.partial(torch.full, shape, value)
    return out


def _stored_scale(scale: torch.Tensor, scheme: Fp8Scheme, method: str) -> torch.Tensor:
    if scheme.weight_strategy == "tensor":  # AutoFP8/vLLM fp8: a scalar; compressed-tensors: [1]
        return scale.reshape(()) if method == "fp8" else scale.reshape(1)
    return scale.contiguous()


def write_fp8_checkpoint(
    src_dir: str | Path,
    out_dir: str | Path,
    quantization_config: Mapping[str, Any],
    input_amax: Mapping[str, float] | None = None,
) -> Path:
    """Quantise the dense HF directory ``src_dir`` into ``out_dir`` (``config.json`` with
    ``quantization_config`` added, one ``model.safetensors``; other files are not copied).

    Raises:
        ModelConfigError: the config or ``quantization_config`` is not supported.
        ValueError: a static scheme without ``input_amax``.
    """
    from safetensors.torch import save_file

    from turnout.engine.model.loader import safetensors_source

    src, out = Path(src_dir), Path(out_dir)
    hf = json.loads((src / "config.json").read_text())
    hf["quantization_config"] = dict(quantization_config)
    config = ModelConfig.from_hf_dict(hf)
    source = quantize_tensors(safetensors_source(src), config, input_amax)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: get().contiguous() for k, get in source.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return out


def dequantize_checkpoint(
    src_dir: str | Path, out_dir: str | Path, *, dtype: torch.dtype = torch.float32
) -> Path:
    """The dense copy of the FP8 directory ``src_dir``: every FP8 weight replaced by
    ``weight.float() * scale`` at ``dtype``, scales dropped, ``quantization_config`` removed;
    HF transformers loads it as an ordinary checkpoint (the parity reference)."""
    from safetensors.torch import save_file

    from turnout.engine.model.loader import read_hf_config, safetensors_source

    src, out = Path(src_dir), Path(out_dir)
    config = read_hf_config(src)
    q = config.quantization
    assert isinstance(q, Fp8Config), f"{src} is not an FP8 checkpoint"
    source = safetensors_source(src)
    dense: dict[str, torch.Tensor] = {}
    for name, get in source.items():
        if name.endswith((".input_scale", "." + q.scale_name)):
            continue
        tensor = get()
        module = name.removesuffix(".weight")
        if tensor.dtype == FP8_DTYPE:
            scheme = q.scheme_for(module)
            assert scheme is not None, f"{name} is FP8 but the config keeps it dense"
            scale = source[f"{module}.{q.scale_name}"]().float()
            rows = scale.reshape(-1) if scheme.weight_strategy != "block" else scale
            if scheme.weight_strategy == "tensor":
                rows = rows.expand(tensor.shape[0])
            tensor = dequantize_fp8(tensor, rows, scheme.weight_block_size)
        dense[name] = tensor.to(dtype).contiguous()
    hf = json.loads((src / "config.json").read_text())
    hf.pop("quantization_config")
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    out.mkdir(parents=True, exist_ok=True)
    save_file(dense, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return out


def calibrate_input_amax(
    model: nn.Module, batches: Iterable[Any], forward: Callable[[nn.Module, Any], Any] | None = None
) -> dict[str, float]:
    """``amax(|x|)`` of the input of every ``nn.Linear`` of ``model`` over ``batches`` (its
    module names as keys: an HF transformers model gives HF names). ``forward(model, batch)``
    runs one batch (default ``model(batch)``)."""
    amax: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):

            def hook(_m: nn.Module, args: tuple[torch.Tensor, ...], n: str = name) -> None:
                amax[n] = max(amax.get(n, 0.0), float(args[0].detach().abs().amax()))

            hooks.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for batch in batches:
                (forward or (lambda m, b: m(b)))(model, batch)
    finally:
        for h in hooks:
            h.remove()
    return amax


__all__ = [
    "calibrate_input_amax",
    "dequantize_checkpoint",
    "linear_weight_names",
    "quantize_fp8_weight",
    "quantize_tensors",
    "write_fp8_checkpoint",
]
