"""``load_model``: a decoder or encoder from an HF safetensors directory, a ``.gguf`` file, or a
:class:`ModelConfig` (seeded random weights). Models are built on the meta device and their
weights assigned once (no second copy); see ``engine.model.weights``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from turnout.engine.model.attention import ATTENTION_BACKENDS
from turnout.engine.model.bert import BertForSequenceClassification, EncoderModel
from turnout.engine.model.config import ModelConfig, ModelConfigError
from turnout.engine.model.fp8 import load_fp8_linears
from turnout.engine.model.fp8_config import Fp8Config
from turnout.engine.model.llama import DecoderModel
from turnout.engine.model.moe_weights import moe_weight_recipes
from turnout.engine.model.opt import opt_weight_names
from turnout.engine.model.parallel_layers import TensorParallel, shard_decoder, weight_sharder
from turnout.engine.model.quantization import quantization_report
from turnout.engine.model.registry import decoder_class
from turnout.engine.model.weights import (
    WeightLoadError,
    WeightSource,
    assign_weights,
    random_source,
)

#: How weights are obtained (vLLM's ``--load-format`` values this engine serves).
LOAD_FORMATS: tuple[str, ...] = ("auto", "dummy")


def load_model(
    source: str | Path | ModelConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    attn_backend: str = "auto",
    load_format: str = "auto",
    tensor_parallel: TensorParallel | None = None,
) -> DecoderModel | EncoderModel:
    """Load a model in eval mode, its weights at ``dtype`` on ``device``.

    Args:
        source: an HF directory (``config.json`` + ``*.safetensors``), a ``.gguf`` file, or a
            :class:`ModelConfig` for random weights drawn with ``seed``
            (``engine.model.weights.random_tensor``; equal to what
            :func:`write_random_weights` writes for the same config and seed; quantised to FP8
            when the config has an FP8 ``quantization_config`` with dynamic activations).
        attn_backend: ``"auto"`` (Triton on CUDA, torch reference on CPU), ``"triton"`` or
            ``"torch"``; for attention and the fused MoE experts alike.
        load_format: ``"auto"`` reads the weights; ``"dummy"`` (vLLM's ``--load-format dummy``)
            reads only ``config.json`` of an HF directory and draws seeded random weights on
            ``device`` itself (``random_tensor``; CUDA's generator gives other values than
            the CPU's), for models whose checkpoint would not fit the disk or take minutes to
            draw on the host.
        tensor_parallel: this process's rank of a tensor-parallel group (size > 1): the model
            is that rank's shard (``engine.model.parallel_layers``); every tensor is read (or
            drawn) whole on the host and cut there, so the device holds only the shard.

    Raises:
        FileNotFoundError: the path does not exist or holds no weights.
        ModelConfigError: the config names an unsupported architecture or feature.
        WeightLoadError: the weights do not fit the architecture.
        ValueError: an unknown ``attn_backend`` or ``load_format``, or an architecture (or
            head counts) ``tensor_parallel`` cannot shard.
    """
    tp = tensor_parallel if tensor_parallel is not None and tensor_parallel.size > 1 else None
    if attn_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attn_backend must be one of {ATTENTION_BACKENDS}, got {attn_backend!r}")
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    if load_format == "dummy" and not isinstance(source, ModelConfig):
        path = Path(source)
        if not path.is_dir():
            raise FileNotFoundError(f"load_format='dummy' needs an HF model directory, got {path}")
        source = read_hf_config(path)
        return _random_model(
            source, seed, torch.device(device).type, dtype, device, attn_backend, tp
        )
    if isinstance(source, ModelConfig):
        return _random_model(source, seed, "cpu", dtype, device, attn_backend, tp)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if path.is_file() and path.suffix == ".gguf":
        from turnout.engine.model.gguf_loader import (
            read_gguf,  # the gguf package is needed only here
        )

        config, weights = read_gguf(path)
        return build_model(
            config,
            weights,
            dtype=dtype,
            device=device,
            attn_backend=attn_backend,
            tensor_parallel=tp,
        )
    if path.is_dir():
        config = read_hf_config(path)
        return build_model(
            config,
            safetensors_source(path),
            dtype=dtype,
            device=device,
            attn_backend=attn_backend,
            tensor_parallel=tp,
        )
    raise FileNotFoundError(f"{path} is neither an HF model directory nor a .gguf file")


def _random_model(
    config: ModelConfig,
    seed: int,
    draw_on: str,
    dtype: torch.dtype,
    device: torch.device | str,
    attn_backend: str,
    tp: TensorParallel | None,
) -> DecoderModel | EncoderModel:
    weights = random_source(config, seed, draw_on)
    if isinstance(config.quantization, Fp8Config):  # quantised by the format's own rule
        from turnout.engine.model.fp8_checkpoint import quantize_tensors

        weights = quantize_tensors(weights, config)
    return build_model(
        config, weights, dtype=dtype, device=device, attn_backend=attn_backend, tensor_parallel=tp
    )


def read_hf_config(model_dir: Path) -> ModelConfig:
    """The :class:`ModelConfig` of ``model_dir/config.json``.

    Raises:
        FileNotFoundError: no config.json.
        ModelConfigError: not UTF-8, invalid JSON, not an object, a field of the wrong type, or
            an unsupported config (the file is named).
    """
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: expected a JSON object, got a {type(data).__name__}")
    try:
        return ModelConfig.from_hf_dict(data)
    except ModelConfigError as e:
        raise ModelConfigError(f"{path}: {e}") from e
    except (TypeError, ValueError) as e:  # a field of the wrong type met int() / float()
        raise ModelConfigError(f"{path}: a field has the wrong type: {e}") from e


def safetensors_source(model_dir: Path) -> WeightSource:
    """Lazy tensors of every ``*.safetensors`` file in ``model_dir`` (memory-mapped).

    Raises:
        FileNotFoundError: no ``*.safetensors`` file.
        WeightLoadError: a file is truncated or corrupt, or two files hold the same tensor name.
    """
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors files")
    source: dict[str, object] = {}
    for file in files:
        try:  # the header is parsed and checked against the file size here
            handle = safe_open(str(file), framework="pt", device="cpu")
        except Exception as exc:  # SafetensorError is not a ValueError
            raise WeightLoadError(
                f"{file}: not a readable safetensors file (truncated or corrupt): {exc}"
            ) from exc
        for name in handle.keys():  # type: ignore[no-untyped-call]  # noqa: SIM118 - safe_open is not a Mapping; safetensors' stub leaves keys() unannotated
            if name in source:
                raise WeightLoadError(f"tensor {name} appears in two files of {model_dir}")
            source[name] = lambda h=handle, n=name: h.get_tensor(n)
    return source  # type: ignore[return-value]


class _SkipParameterInit(TorchFunctionMode):
    """Skip ``torch.nn.init`` calls while a model is built on the meta device.

    ``nn.Linear``, ``nn.Embedding`` and ``nn.LayerNorm`` initialise their parameters in their
    constructors. On meta tensors those values are never read (every parameter is assigned from
    the weights, and :func:`_check_materialised` refuses any left on meta), but the first such
    call imports ``torch._dynamo`` through the meta decompositions: 1.6 s of a 135M model's
    7.4 s load on CPU (torch 2.13). The ``torch.nn.init`` functions dispatch through
    ``__torch_function__`` whenever a mode is active, so this mode answers them with the tensor
    unchanged and passes every other call on. Modes are per thread.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def build_model(
    config: ModelConfig,
    weights: WeightSource,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    attn_backend: str = "auto",
    tensor_parallel: TensorParallel | None = None,
) -> DecoderModel | EncoderModel:
    """Build ``config``'s model on the meta device (``tensor_parallel``: this rank's shard of
    it), assign ``weights``, build buffers."""
    tp = tensor_parallel if tensor_parallel is not None and tensor_parallel.size > 1 else None
    with torch.device("meta"), _SkipParameterInit():
        model = _new_model(config, attn_backend)
        if tp is not None:
            if type(model) is not DecoderModel:
                raise ValueError(
                    f"tensor_parallel_size={tp.size}: {config.architecture} is not sharded"
                )
            shard_decoder(model, tp)
    if isinstance(model, DecoderModel):
        if config.opt is not None:
            weights = opt_weight_names(weights)
        if config.tie_word_embeddings:  # some tied checkpoints also store the shared head
            weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        if isinstance(config.quantization, Fp8Config):
            weights = load_fp8_linears(
                model,
                config.quantization,
                weights,
                dtype=dtype,
                device=device,
                fused=model.fused_params,
            )
        assign_weights(
            model,
            weights,
            dtype=dtype,
            device=device,
            fused=model.fused_params,
            recipes=moe_weight_recipes(config),
            shard=weight_sharder(model) if tp is not None else None,
        )
        model.tie_weights()
        rotary = getattr(model.model, "rotary_emb", None)  # OPT has learned positions
        if rotary is not None:
            rotary.build_cache(device)
    else:
        assign_weights(
            model, weights, dtype=dtype, device=device, fused={}, prefix_aliases=("bert.",)
        )
    _check_materialised(model)
    model.quantization_report = quantization_report(model, config, dtype=dtype, device=device)
    return model.eval()


def _new_model(config: ModelConfig, attn_backend: str) -> DecoderModel | EncoderModel:
    if config.is_encoder:
        return (
            EncoderModel(config)
            if config.classifier is None
            else BertForSequenceClassification(config)
        )
    return decoder_class(config)(config, attn_backend)


def _check_materialised(model: nn.Module) -> None:
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise WeightLoadError(f"tensors left unset after loading: {', '.join(left[:8])}")
