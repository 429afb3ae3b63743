"""What the weights of a loaded model are and how they run: one :class:`QuantizationReport` per
model, logged by the engine at load time (``engine.runner_setup``).

``method`` is vLLM's ``--quantization`` name, the value the engine reports to the oracle
(``ModelConfig.quantization_method``): ``none``, ``fp8``, ``compressed-tensors`` or ``gguf``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.fp8 import Fp8Linear
from turnout.engine.model.fp8_config import Fp8Config

#: Said in the log and the docs: GGUF tensors are always dequantised when loaded.
GGUF_EXECUTION = (
    "dequantised to {dtype} on load; turnout has no GGUF kernel, so GGUF "
    "weights run unquantised on every device, GPU included"
)


@dataclass(frozen=True)
class QuantizationReport:
    """``method`` (the oracle's value), ``detail`` (what the checkpoint holds) and
    ``execution`` (what the model layer does with it on this device)."""

    method: str
    detail: str
    execution: str

    def __str__(self) -> str:
        return f"weights: {self.method} ({self.detail}): {self.execution}"


def quantization_report(
    model: nn.Module, config: ModelConfig, *, dtype: torch.dtype, device: torch.device | str
) -> QuantizationReport:
    """The report of a model :func:`engine.model.load_model` has just built."""
    dtype_name = str(dtype).removeprefix("torch.")
    q = config.quantization
    if q is None:
        return QuantizationReport("none", "unquantized", f"{dtype_name} on {torch.device(device)}")
    if isinstance(q, Fp8Config):
        return _fp8_report(model, q, dtype_name)
    return QuantizationReport(q.method, q.describe(), GGUF_EXECUTION.format(dtype=dtype_name))


def _fp8_report(model: nn.Module, q: Fp8Config, dtype_name: str) -> QuantizationReport:
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    num_linear = len(layers) + sum(isinstance(m, nn.Linear) for m in model.modules())
    detail = f"{'; '.join(s.describe() for s in q.schemes)}; {len(layers)} of {num_linear} linear layers FP8"
    ways: Counter[str] = Counter()
    for m in layers:
        if m.execution == "scaled_mm" and m.block_size is not None:
            ways[
                "W8A8 through F.scaled_mm (dynamic 1x128 activation scales, 128x128 weight blocks)"
            ] += 1
        elif m.execution == "scaled_mm":
            acts = (
                "static input scales"
                if m.input_scale is not None
                else "dynamic per-token activation scales"
            )
            ways[f"W8A8 through torch._scaled_mm ({acts})"] += 1
        else:
            ways[
                f"float8_e4m3fn weights dequantised to {dtype_name} per matmul ({m.reference_reason})"
            ] += 1
    execution = "; ".join(f"{n} layers: {way}" for way, n in ways.items()) or "no FP8 layer"
    return QuantizationReport(q.method, detail, execution)


__all__ = ["GGUF_EXECUTION", "QuantizationReport", "quantization_report"]
