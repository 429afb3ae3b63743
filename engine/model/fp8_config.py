"""FP8 checkpoints: the ``quantization_config`` of an HF ``config.json``, read into a frozen
:class:`Fp8Config` (which linear layers are FP8, with which scales).

Two public formats, as vLLM reads them:

- ``quant_method: "fp8"`` (vLLM's ``Fp8Config``, ``vllm/model_executor/layers/quantization/
  fp8.py``; AutoFP8 and HF's FineGrainedFP8 write it): ``activation_scheme`` ``dynamic`` or
  ``static``; per-tensor ``weight_scale`` (a scalar per projection) and, when static, a scalar
  ``input_scale``; or, with ``weight_block_size: [block_n, block_k]``, block-wise scales
  ``weight_scale_inv`` ``[ceil(out / block_n), ceil(in / block_k)]`` (the name says "inverse",
  but the dequantised weight is ``weight * weight_scale_inv``; dynamic activations only).
  ``ignored_layers`` (vLLM) or ``modules_to_not_convert`` (HF) name the layers kept dense.
- ``quant_method: "compressed-tensors"`` (llm-compressor; vLLM's ``CompressedTensorsW8A8Fp8`` /
  ``W8A16Fp8`` schemes): ``format`` ``float-quantized`` (or ``naive-quantized``), and
  ``config_groups`` whose 8-bit ``float`` ``weights`` use ``strategy`` ``tensor``
  (``weight_scale`` ``[1]``), ``channel`` (``weight_scale`` ``[out, 1]``) or ``block``
  (``block_structure``, ``weight_scale`` ``[ceil(out/bn), ceil(in/bk)]``), each group with its
  ``targets`` (``Linear``, a module name, or ``re:<regex>``) and ``input_activations`` (dynamic,
  static per-tensor with ``input_scale``, or none: weight-only); ``ignore`` lists the layers kept
  dense (``lm_head`` usually).

Every weight dequantises as ``weight.float() * scale`` (broadcast per tensor, row or block).
Anything else in the config is refused by name: 4-bit or integer schemes, asymmetric
scales, ``e5m2``, KV-cache schemes, sparsity or transforms, static activations with block
weights, other methods (AWQ, GPTQ, ...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turnout.engine.model.config import ModelConfigError

if TYPE_CHECKING:
    from turnout.engine.model.config import ModelConfig

FP8_METHODS = ("fp8", "compressed-tensors")
WEIGHT_STRATEGIES = ("tensor", "channel", "block")
#: ``activation``: ``dynamic`` (scales computed per token at run time), ``static`` (the
#: checkpoint's per-tensor ``input_scale``), ``none`` (weight-only: activations stay dense).
ACTIVATION_SCHEMES = ("dynamic", "static", "none")


@dataclass(frozen=True)
class Fp8Scheme:
    """How one linear layer's FP8 weight is scaled, and how its input is quantised."""

    weight_strategy: str  # one of WEIGHT_STRATEGIES
    activation: str  # one of ACTIVATION_SCHEMES
    weight_block_size: tuple[int, int] | None = None  # (block_n, block_k) for "block"

    def describe(self) -> str:
        weights = (
            f"{self.weight_block_size[0]}x{self.weight_block_size[1]} block"
            if self.weight_block_size
            else f"per-{self.weight_strategy}"
        )
        acts = {
            "dynamic": "dynamic activations",
            "static": "static per-tensor input scales",
            "none": "weight-only",
        }[self.activation]
        return f"{weights} weight scales, {acts}"


@dataclass(frozen=True)
class Fp8Group:
    """Layers matched by ``targets`` use ``scheme`` (compressed-tensors ``config_groups``)."""

    targets: tuple[str, ...]
    scheme: Fp8Scheme


@dataclass(frozen=True)
class Fp8Config:
    """A parsed FP8 ``quantization_config`` (see the module docstring for the formats).

    ``method`` is vLLM's ``--quantization`` name of the format (``"fp8"`` or
    ``"compressed-tensors"``), the value the engine reports to the oracle. ``scale_name`` is the
    tensor suffix of the weight scales (``weight_scale``, or ``weight_scale_inv`` for the fp8
    method's block-wise checkpoints). ``raw`` is the mapping as the checkpoint gave it
    (sorted key/value pairs, for :meth:`to_hf_dict`).
    """

    method: str
    groups: tuple[Fp8Group, ...]
    ignore: tuple[str, ...] = ()
    scale_name: str = "weight_scale"
    raw: str = "{}"

    def scheme_for(self, module: str) -> Fp8Scheme | None:
        """The scheme of the linear layer with HF module name ``module`` (``model.layers.0.
        self_attn.q_proj``), or ``None`` when it stays dense."""
        if any(_matches(entry, module) for entry in self.ignore):
            return None
        for group in self.groups:
            if any(_target_matches(t, module) for t in group.targets):
                return group.scheme
        return None

    @property
    def schemes(self) -> tuple[Fp8Scheme, ...]:
        return tuple(dict.fromkeys(g.scheme for g in self.groups))

    def describe(self) -> str:
        return f"{self.method} ({'; '.join(s.describe() for s in self.schemes)})"

    def to_hf_dict(self) -> dict[str, Any]:
        import json

        return dict(json.loads(self.raw))


def parse_quantization_config(config: ModelConfig, qc: Any) -> Fp8Config:
    """The :class:`Fp8Config` of ``config.json``'s ``quantization_config``.

    Raises:
        ModelConfigError: not a mapping, a method other than FP8, a pooling model, a model with
            Mamba layers or experts, or a scheme the layer cannot honour (named in the message).
    """
    if not isinstance(qc, Mapping):
        raise ModelConfigError(f"quantization_config must be an object, got {type(qc).__name__}")
    method = str(qc.get("quant_method", "")).lower().replace("_", "-")
    if method not in FP8_METHODS:
        raise ModelConfigError(
            f"quantization_config.quant_method {qc.get('quant_method')!r} is not supported; "
            f"supported: FP8 checkpoints ({', '.join(FP8_METHODS)})"
        )
    if config.is_pooling:
        raise ModelConfigError(
            f"{config.architecture}: FP8 weights are supported for generating decoders only"
        )
    if config.has_inner_state:  # the Mamba mixer's projections have no FP8 path
        raise ModelConfigError(
            f"{config.architecture}: FP8 weights are not supported for models with "
            "Mamba layers; use an unquantised checkpoint"
        )
    if config.moe is not None:  # the fused MoE kernel takes bf16/fp16/fp32 experts
        raise ModelConfigError(
            f"{config.architecture}: FP8 weights are not supported for mixture-of-"
            "experts models; use an unquantised checkpoint"
        )
    import json

    raw = json.dumps(qc, sort_keys=True, default=str)
    if method == "fp8":
        return _vllm_fp8(qc, raw)
    return _compressed_tensors(qc, raw)


def _vllm_fp8(qc: Mapping[str, Any], raw: str) -> Fp8Config:
    scheme = str(qc.get("activation_scheme", "dynamic"))  # HF's FineGrainedFP8 default
    if scheme not in ("dynamic", "static"):
        raise ModelConfigError(
            f"quantization_config.activation_scheme {scheme!r}: expected dynamic or static"
        )
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelConfigError(
            f"quantization_config.fmt {fmt!r}: only float8 e4m3 weights are supported"
        )
    block = qc.get("weight_block_size")
    if block is not None:
        block = _block(block, "quantization_config.weight_block_size")
        if scheme != "dynamic":
            raise ModelConfigError(
                "quantization_config: block-wise FP8 (weight_block_size) supports "
                "activation_scheme 'dynamic' only (as vLLM)"
            )
    ignore = [*(qc.get("ignored_layers") or ()), *(qc.get("modules_to_not_convert") or ())]
    weights = Fp8Scheme("block" if block else "tensor", scheme, block)
    return Fp8Config(
        "fp8",
        (Fp8Group(("Linear",), weights),),
        tuple(str(i) for i in ignore),
        scale_name="weight_scale_inv" if block else "weight_scale",
        raw=raw,
    )


_CT_FORMATS = ("float-quantized", "naive-quantized")
_CT_REFUSED_KEYS = ("kv_cache_scheme", "sparsity_config", "transform_config")


def _compressed_tensors(qc: Mapping[str, Any], raw: str) -> Fp8Config:
    fmt = qc.get("format")
    if fmt not in _CT_FORMATS:
        raise ModelConfigError(
            f"compressed-tensors format {fmt!r} is not supported; "
            f"supported: {', '.join(_CT_FORMATS)} (FP8)"
        )
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise ModelConfigError(
            f"compressed-tensors quantization_status {status!r}: only "
            "'compressed' checkpoints (FP8 tensors stored) are supported"
        )
    for key in _CT_REFUSED_KEYS:
        if qc.get(key):
            raise ModelConfigError(f"compressed-tensors {key} is not supported")
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ModelConfigError("compressed-tensors config_groups must be a non-empty object")
    parsed = tuple(_ct_group(str(name), g) for name, g in groups.items())
    ignore = qc.get("ignore") or ()
    return Fp8Config("compressed-tensors", parsed, tuple(str(i) for i in ignore), raw=raw)


def _ct_group(name: str, g: Any) -> Fp8Group:
    where = f"compressed-tensors config_groups.{name}"
    if not isinstance(g, Mapping):
        raise ModelConfigError(f"{where} must be an object")
    if g.get("format") not in (None, *_CT_FORMATS):
        raise ModelConfigError(f"{where}.format {g.get('format')!r} is not supported (FP8 only)")
    if g.get("output_activations"):
        raise ModelConfigError(f"{where}.output_activations is not supported")
    targets = g.get("targets")
    if not isinstance(targets, Sequence) or isinstance(targets, str) or not targets:
        raise ModelConfigError(f"{where}.targets must be a non-empty list")
    for t in targets:
        if not (t == "Linear" or str(t).startswith("re:") or "." in str(t) or t == "lm_head"):
            raise ModelConfigError(
                f"{where}.targets: {t!r} is not supported (Linear, a module name, or re:<regex>)"
            )
    weights = _ct_args(g.get("weights"), f"{where}.weights")
    strategy = weights["strategy"]
    if strategy not in WEIGHT_STRATEGIES:
        raise ModelConfigError(
            f"{where}.weights.strategy {strategy!r} is not supported; "
            f"supported: {', '.join(WEIGHT_STRATEGIES)}"
        )
    if weights.get("dynamic"):
        raise ModelConfigError(f"{where}.weights.dynamic: weights must be stored quantised")
    block = (
        _block(weights.get("block_structure"), f"{where}.weights.block_structure")
        if strategy == "block"
        else None
    )
    acts = g.get("input_activations")
    activation = "none"
    if acts:
        acts = _ct_args(acts, f"{where}.input_activations")
        activation = "dynamic" if acts.get("dynamic") is True else "static"
        if acts.get("dynamic") not in (True, False, None):
            raise ModelConfigError(
                f"{where}.input_activations.dynamic {acts.get('dynamic')!r} is not supported"
            )
        if activation == "static" and (acts.get("strategy") != "tensor" or block):
            raise ModelConfigError(
                f"{where}.input_activations: static activation scales are "
                "supported per tensor, with tensor or channel weight scales"
            )
    return Fp8Group(tuple(str(t) for t in targets), Fp8Scheme(strategy, activation, block))


def _ct_args(args: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise ModelConfigError(f"{where} must be an object")
    if args.get("num_bits") != 8 or args.get("type") != "float":
        raise ModelConfigError(
            f"{where}: only 8-bit float (FP8 e4m3) quantization is supported, "
            f"got num_bits={args.get('num_bits')!r} type={args.get('type')!r}"
        )
    if args.get("symmetric") is False:
        raise ModelConfigError(f"{where}.symmetric: asymmetric FP8 scales are not supported")
    return args


def _block(value: Any, where: str) -> tuple[int, int]:
    if (
        not isinstance(value, Sequence)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ModelConfigError(
            f"{where} must be two positive integers [block_n, block_k], got {value!r}"
        )
    return int(value[0]), int(value[1])


def _target_matches(target: str, module: str) -> bool:
    if target == "Linear":  # the class name: every linear layer
        return True
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return module == target


def _matches(entry: str, module: str) -> bool:
    """``ignore`` / ``ignored_layers`` entries: ``re:`` regexes, exact names, a layer's last
    name (``lm_head``), or a parent module (vLLM's prefix rule)."""
    if entry.startswith("re:"):
        return re.match(entry[3:], module) is not None
    return module == entry or module.endswith("." + entry) or module.startswith(entry + ".")


__all__ = [
    "ACTIVATION_SCHEMES",
    "FP8_METHODS",
    "WEIGHT_STRATEGIES",
    "Fp8Config",
    "Fp8Group",
    "Fp8Scheme",
    "parse_quantization_config",
]
