"""FP8 linear layers: weights kept as ``torch.float8_e4m3fn`` with float32 scales, loaded from
the checkpoint formats of ``engine.model.fp8_config``.

Two ways to run a layer, chosen once at load time (:func:`choose_fp8_execution`) and logged:

- ``scaled_mm`` (CUDA, compute capability >= 8.9, bfloat16 activations, activations
  quantised): per-tensor or per-channel weight scales run W8A8 through ``torch._scaled_mm`` with
  row-wise scales, ``scale_a [M, 1]`` per token and ``scale_b [1, N]`` per output channel.
  Activations are quantised by one Triton launch (``kernels.fp8_quant``).
  Activation scales are **dynamic per token** (``amax(|x_row|) / 448``) unless the checkpoint
  stores a static ``input_scale``, which is then used for every token. Per token rather than
  per tensor because a per-tensor dynamic scale couples the tokens of a batch: one request's
  outlier would coarsen every other request's activations, so outputs would depend on what
  else was scheduled (chunked prefill, batch composition), which the runners' parity contract
  forbids; per-token scales are also what vLLM picks on Hopper (``Fp8LinearOp``
  ``use_per_token_if_dynamic``; ``GroupShape.PER_TOKEN`` in ``CompressedTensorsW8A8Fp8``).
  Block-wise checkpoints (128x128 weight blocks, DeepSeek-V3's format) run W8A8 through
  ``torch.nn.functional.scaled_mm`` with activations quantised per token and 128 channels
  (``BlockWise1x128`` x ``BlockWise128x128``, vLLM's ``W8A8BlockFp8LinearOp`` scheme).
- ``reference`` (CPU, GPUs without FP8 tensor cores, float32/float16 models, weight-only
  schemes, blocks other than 128x128, shapes the GEMMs cannot take): the weight is dequantised for each
  matmul (``weight.float() * scale`` cast to the activation dtype) and used with
  ``F.linear``; activations are not quantised. The FP8 copy stays the only one in memory.

Fused projections (``qkv_proj``, ``gate_up_proj``) concatenate their pieces' FP8 rows, and the
per-tensor scale of each piece is spread over its rows (an exact per-row scale: no
requantisation). Their static input scales are the maximum over the pieces (they quantise the
same input; vLLM does the same).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from turnout.engine.model.fp8_config import Fp8Config, Fp8Scheme
from turnout.engine.model.weights import WeightLoadError, WeightSource
from turnout.kernels._triton import HAS_TRITON
from turnout.kernels.fp8_quant import FP8_DTYPE, quantize_fp8, quantize_fp8_ref

EXECUTIONS = ("scaled_mm", "reference")


def _quantize(x: torch.Tensor, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    # One Triton launch on CUDA (kernels.fp8_quant); its torch reference elsewhere.
    quant = quantize_fp8 if x.is_cuda and HAS_TRITON else quantize_fp8_ref
    return quant(x, **kwargs)  # type: ignore[arg-type]


def fp8_linear(
    x: torch.Tensor,  # [M, K] bfloat16, CUDA
    weight: torch.Tensor,  # [N, K] float8_e4m3fn, contiguous
    weight_scale: torch.Tensor,  # [N] float32, per output row
    input_scale: torch.Tensor | None = None,  # [] float32 (static) or None (dynamic per token)
) -> torch.Tensor:  # [M, N] bfloat16
    """W8A8 ``x @ dequant(weight).T`` through ``torch._scaled_mm`` (row-wise scales).

    Raises:
        ValueError: wrong dtypes, shapes, or ``K``/``N`` not multiples of 16 (cuBLASLt's FP8
            layout rule).
    """
    if (
        x.dtype != torch.bfloat16
        or weight.dtype != FP8_DTYPE
        or weight_scale.dtype != torch.float32
    ):
        raise ValueError(
            f"fp8_linear: x bfloat16, weight float8_e4m3fn, weight_scale float32; got "
            f"{x.dtype}, {weight.dtype}, {weight_scale.dtype}"
        )
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"fp8_linear: x [M, K] and weight [N, K]; got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if weight.shape[0] % 16 or weight.shape[1] % 16 or weight_scale.shape != (weight.shape[0],):
        raise ValueError(
            f"fp8_linear: N and K must be multiples of 16 and weight_scale [N]; got "
            f"weight {tuple(weight.shape)}, weight_scale {tuple(weight_scale.shape)}"
        )
    if not weight.is_contiguous():
        raise ValueError("fp8_linear: weight must be contiguous (its transpose is column-major)")
    xq, scale_a = _quantize(x, static_scale=input_scale)  # [M, K] fp8, [M, 1] float32
    return torch._scaled_mm(
        xq, weight.t(), scale_a=scale_a, scale_b=weight_scale.view(1, -1), out_dtype=torch.bfloat16
    )


def fp8_block_linear(
    x: torch.Tensor,  # [M, K] bfloat16, CUDA; K % 128 == 0
    weight: torch.Tensor,  # [N, K] float8_e4m3fn, contiguous; N % 128 == 0
    weight_scale: torch.Tensor,  # [N / 128, K / 128] float32, contiguous, per 128x128 block
) -> torch.Tensor:  # [M, N] bfloat16
    """Block-wise W8A8 ``x @ dequant(weight).T``: activations quantised per token and 128
    channels, weights per 128x128 block, through ``torch.nn.functional.scaled_mm``'s
    ``BlockWise1x128`` x ``BlockWise128x128`` recipes (vLLM's ``W8A8BlockFp8LinearOp`` scheme).

    Raises:
        ValueError: wrong dtypes, or shapes that are not whole 128 blocks.
    """
    if (
        x.dtype != torch.bfloat16
        or weight.dtype != FP8_DTYPE
        or weight_scale.dtype != torch.float32
    ):
        raise ValueError(
            f"fp8_block_linear: x bfloat16, weight float8_e4m3fn, weight_scale float32; got "
            f"{x.dtype}, {weight.dtype}, {weight_scale.dtype}"
        )
    n, k = weight.shape
    if (
        x.dim() != 2
        or x.shape[1] != k
        or n % 128
        or k % 128
        or weight_scale.shape != (n // 128, k // 128)
        or not weight_scale.is_contiguous()
    ):
        raise ValueError(
            f"fp8_block_linear: x [M, K], weight [N, K] with N, K multiples of 128, "
            f"weight_scale [N/128, K/128] contiguous; got {tuple(x.shape)}, "
            f"{tuple(weight.shape)}, {tuple(weight_scale.shape)}"
        )
    # cuBLASLt wants the (outer-dim-major) tile scales' columns 16-byte aligned: rows padded to 4.
    xq, scale_a = _quantize(x, group_size=128, pad_rows_to=4)
    recipe = F.ScalingType
    # The weight's transpose is [K, N] column-major; its scales read as [K/128, N/128].
    out = F.scaled_mm(
        xq,
        weight.t(),
        scale_a,
        recipe.BlockWise1x128,
        weight_scale.t(),
        recipe.BlockWise128x128,
        output_dtype=torch.bfloat16,
    )
    return out[: x.shape[0]]


def dequantize_fp8(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,  # [N, K] fp8; see below
    block_size: tuple[int, int] | None = None,
) -> torch.Tensor:  # [N, K] float32
    """``weight.float() * scale``; ``weight_scale`` is ``[N]`` (per row) or, with
    ``block_size = (bn, bk)``, ``[ceil(N / bn), ceil(K / bk)]`` (per block)."""
    w = weight.float()
    if block_size is None:
        return w * weight_scale.float().view(-1, 1)
    bn, bk = block_size
    n, k = w.shape
    full = weight_scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return w * full


def fp8_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,  # [M, K], ...
    bias: torch.Tensor | None = None,
    block_size: tuple[int, int] | None = None,
) -> torch.Tensor:  # [M, N], x.dtype
    """The dequantising reference: ``F.linear(x, dequant(weight).to(x.dtype), bias)``."""
    return F.linear(x, dequantize_fp8(weight, weight_scale, block_size).to(x.dtype), bias)


class Fp8Linear(nn.Module):
    """A linear layer with an FP8 weight ``[out, in]`` and float32 scales (module docstring).

    ``execution`` is ``"scaled_mm"`` or ``"reference"``; :func:`choose_fp8_execution` sets it.
    """

    # Registered as parameters (None until the loader fills them) in __init__.
    weight: torch.Tensor | None
    weight_scale: torch.Tensor | None
    input_scale: torch.Tensor | None
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, scheme: Fp8Scheme) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.block_size = scheme.weight_block_size
        for name in ("weight", "weight_scale", "input_scale", "bias"):  # filled by the loader
            self.register_parameter(name, None)
        self.execution = "reference"
        self.reference_reason = ""  # why "reference" was chosen, for the load log

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]
        assert self.weight is not None and self.weight_scale is not None
        if self.execution == "scaled_mm":
            if self.block_size is not None:
                out = fp8_block_linear(x, self.weight, self.weight_scale)
            else:
                out = fp8_linear(x, self.weight, self.weight_scale, self.input_scale)
            return out + self.bias if self.bias is not None else out
        return fp8_linear_ref(x, self.weight, self.weight_scale, self.bias, self.block_size)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.scheme.describe()}, {self.execution}"


@dataclass(frozen=True)
class Fp8Execution:
    """What :func:`choose_fp8_execution` decided: ``execution`` and, for ``reference``, why."""

    execution: str
    reason: str = ""


def choose_fp8_execution(
    scheme: Fp8Scheme, shape: tuple[int, int], *, dtype: torch.dtype, device: torch.device
) -> Fp8Execution:
    """``scaled_mm`` where the hardware and the layer allow W8A8, else ``reference`` with why."""
    if device.type != "cuda":
        return Fp8Execution("reference", f"{device.type}: no FP8 matmul")
    if torch.cuda.get_device_capability(device) < (8, 9):
        return Fp8Execution("reference", "GPU without FP8 tensor cores (compute capability < 8.9)")
    if dtype != torch.bfloat16:
        return Fp8Execution("reference", f"{dtype} activations (W8A8 runs with bfloat16)")
    if scheme.activation == "none":
        return Fp8Execution("reference", "weight-only scheme (activations stay dense)")
    if scheme.weight_strategy == "block":
        if scheme.weight_block_size != (128, 128) or not hasattr(F, "scaled_mm"):
            return Fp8Execution(
                "reference",
                f"{scheme.weight_block_size} blocks (the block-scaled FP8 GEMM takes 128x128)",
            )
        if shape[0] % 128 or shape[1] % 128:
            return Fp8Execution("reference", f"shape {shape} not whole 128x128 blocks")
        return Fp8Execution("scaled_mm")
    if shape[0] % 16 or shape[1] % 16:
        return Fp8Execution("reference", f"shape {shape} not a multiple of 16")
    return Fp8Execution("scaled_mm")


def load_fp8_linears(
    model: nn.Module,
    config: Fp8Config,
    source: WeightSource,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    fused: Mapping[str, tuple[str, ...]],
) -> WeightSource:
    """Replace every linear layer the checkpoint quantises by an :class:`Fp8Linear` holding its
    FP8 weight and scales on ``device``; return the rest of ``source`` (biases included) for
    :func:`engine.model.weights.assign_weights`.

    Raises:
        WeightLoadError: a missing scale, a weight that is not float8_e4m3fn, mis-shaped
            scales, or fused pieces with different schemes or misaligned blocks (named).
    """
    rest = dict(source)
    dev = torch.device(device)
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or (name == "lm_head" and _tied(model)):
            continue
        parts = _hf_parts(name, fused)
        schemes = {config.scheme_for(p) for p in parts}
        if schemes == {None}:
            continue
        if len(schemes) > 1:
            raise WeightLoadError(
                f"{', '.join(parts)}: fused into {name}, but their FP8 schemes differ"
            )
        scheme = schemes.pop()
        assert scheme is not None
        layer = Fp8Linear(module.in_features, module.out_features, scheme)
        layer.bias = module.bias  # a meta parameter: assign_weights fills it at the model dtype
        _fill(layer, parts, config, rest, dev)
        decision = choose_fp8_execution(
            scheme, (module.out_features, module.in_features), dtype=dtype, device=dev
        )
        layer.execution = decision.execution
        layer.reference_reason = decision.reason
        _replace(model, name, layer)
    return rest


def _tied(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False))


def _hf_parts(name: str, fused: Mapping[str, tuple[str, ...]]) -> list[str]:
    head, _, last = name.rpartition(".")
    return [f"{head}.{p}" for p in fused[last]] if last in fused else [name]


def _take(rest: dict[str, Callable[[], torch.Tensor]], name: str) -> torch.Tensor:
    if name not in rest:
        raise WeightLoadError(f"FP8 checkpoint lacks {name}")
    return rest.pop(name)()


def _fill(
    layer: Fp8Linear,
    parts: list[str],
    config: Fp8Config,
    rest: dict[str, Callable[[], torch.Tensor]],
    device: torch.device,
) -> None:
    weights, scales, input_scales = [], [], []
    for i, part in enumerate(parts):
        w = _take(rest, f"{part}.weight")
        if w.dtype != FP8_DTYPE or w.dim() != 2 or w.shape[1] != layer.in_features:
            raise WeightLoadError(
                f"{part}.weight: expected float8_e4m3fn [out, {layer.in_features}], "
                f"got {w.dtype} {tuple(w.shape)}"
            )
        s = _take(rest, f"{part}.{config.scale_name}").float()
        scales.append(
            _row_or_block_scale(
                s, w.shape, layer.scheme, f"{part}.{config.scale_name}", last=i == len(parts) - 1
            )
        )
        weights.append(w)
        if layer.scheme.activation == "static":
            input_scales.append(_take(rest, f"{part}.input_scale").float().reshape(()))
    weight = torch.cat(weights).contiguous() if len(weights) > 1 else weights[0].contiguous()
    if weight.shape[0] != layer.out_features:
        raise WeightLoadError(
            f"{', '.join(parts)}: {weight.shape[0]} rows, the layer has {layer.out_features}"
        )
    layer.weight = nn.Parameter(weight.to(device), requires_grad=False)
    layer.weight_scale = nn.Parameter(
        torch.cat(scales).contiguous().to(device), requires_grad=False
    )
    if input_scales:
        layer.input_scale = nn.Parameter(
            torch.stack(input_scales).max().to(device), requires_grad=False
        )


def _row_or_block_scale(
    s: torch.Tensor, shape: torch.Size, scheme: Fp8Scheme, name: str, *, last: bool
) -> torch.Tensor:
    rows, cols = int(shape[0]), int(shape[1])
    if scheme.weight_strategy == "tensor":
        if s.numel() != 1:
            raise WeightLoadError(
                f"{name}: a per-tensor scale has one element, got shape {tuple(s.shape)}"
            )
        return s.reshape(1).expand(rows).clone()
    if scheme.weight_strategy == "channel":
        if s.numel() != rows or s.dim() not in (1, 2) or (s.dim() == 2 and s.shape[1] != 1):
            raise WeightLoadError(
                f"{name}: per-channel scales are [{rows}, 1], got {tuple(s.shape)}"
            )
        return s.reshape(rows)
    assert scheme.weight_block_size is not None
    bn, bk = scheme.weight_block_size
    want = (-(-rows // bn), -(-cols // bk))
    if tuple(s.shape) != want:
        raise WeightLoadError(
            f"{name}: block scales for {rows}x{cols} in {bn}x{bk} blocks are "
            f"{list(want)}, got {list(s.shape)}"
        )
    if rows % bn and not last:
        raise WeightLoadError(
            f"{name}: {rows} rows are not a multiple of block_n {bn}, so the "
            "fused projection's blocks would not line up"
        )
    return s


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, layer)


def set_fp8_execution(model: nn.Module, execution: str) -> int:
    """Force every :class:`Fp8Linear` of ``model`` to ``"reference"``, or back to its own
    choice with ``"auto"`` (tests compare the two on one GPU). Returns the layers changed.

    Raises:
        ValueError: an unknown ``execution``.
    """
    if execution not in ("reference", "auto"):
        raise ValueError(f"execution must be 'reference' or 'auto', got {execution!r}")
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    for m in layers:
        if execution == "reference":
            m.execution = "reference"
        else:
            m.execution = "reference" if m.reference_reason else "scaled_mm"
    return len(layers)
