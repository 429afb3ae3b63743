"""What the engine must know about a model before loading it: its :class:`ModelConfig` (from
``config.json`` or the GGUF header), and the :class:`EngineConfig` that follows from it and
the caller's arguments. Part of the runner wiring: imports the model layer (and so torch)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from turnout.engine.config import EngineConfig, SpeculativeConfig
from turnout.engine.errors import EngineConfigError

logger = logging.getLogger("turnout.engine")


def read_model_config(model: str | Path) -> Any:  # -> engine.model.ModelConfig
    """The model's configuration without loading its weights.

    Raises:
        FileNotFoundError: no such directory / file.
        ModelConfigError: an unsupported or malformed configuration.
    """
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        from turnout.engine.model.gguf_loader import read_gguf

        return read_gguf(path)[0]  # the header only: tensors are read lazily
    from turnout.engine.model.loader import read_hf_config

    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither an HF model directory nor a .gguf file")
    return read_hf_config(path)


def engine_config_for(model: str | Path, model_config: Any = None, **kwargs: Any) -> EngineConfig:
    """An :class:`EngineConfig` for ``model``: vocabulary, EOS ids and the default
    ``max_model_len`` come from the model; ``kwargs`` are :class:`EngineConfig` fields
    (``speculative_config`` may be a dict of vLLM's keys).

    Raises:
        EngineConfigError: ``max_model_len`` above the model's ``max_position_embeddings``, a
            CUDA device on a machine without it (or with fewer GPUs than
            ``tensor_parallel_size``), a ``tensor_parallel_size`` the model cannot be split by
            (its family, or head counts not divisible), or another bad value.
    """
    EngineConfig.check_field_names(set(kwargs))
    from_model = sorted({"vocab_size", "runner_kind", "pooling_tasks"} & set(kwargs))
    if from_model:
        raise EngineConfigError(
            f"{', '.join(from_model)} come from the model's config; do not pass them"
        )
    mc = model_config if model_config is not None else read_model_config(model)
    spec = kwargs.pop("speculative_config", None)
    if spec is not None and not isinstance(spec, SpeculativeConfig):
        spec = SpeculativeConfig.from_dict(spec)
    max_len = kwargs.pop("max_model_len", None)
    if max_len is None:  # 0 is a value (refused by EngineConfig), not "the model's default"
        max_len = mc.max_position_embeddings
    elif isinstance(max_len, int) and max_len > mc.max_position_embeddings:
        raise EngineConfigError(
            f"max_model_len={max_len} is above the model's max_position_embeddings={mc.max_position_embeddings}"
        )
    eos = kwargs.pop("eos_token_ids", None)
    if eos is None:
        eos = tuple(mc.eos_token_ids) if not mc.is_pooling else ()
    # Prompts that cannot be chunked (pooling models, chunked prefill off) must fit one step.
    cannot_chunk = mc.is_pooling or not kwargs.get("enable_chunked_prefill", True)
    if cannot_chunk and isinstance(max_len, int):
        kwargs.setdefault("max_num_batched_tokens", max(2048, max_len))
    kwargs.setdefault("max_num_batched_tokens", 2048)
    _prefix_caching_for_state(mc, kwargs)
    _check_tensor_parallel(mc, kwargs.get("tensor_parallel_size", 1))
    config = EngineConfig(
        model=str(model),
        vocab_size=mc.vocab_size,
        max_model_len=max_len,
        eos_token_ids=tuple(eos),
        runner_kind="pooling" if mc.is_pooling else "generate",
        pooling_tasks=mc.pooling_tasks,
        speculative_config=spec,
        **kwargs,
    )
    _check_device_exists(config.device, config.tensor_parallel_size)
    return config


def _check_tensor_parallel(mc: Any, size: Any) -> None:
    # Before the EngineConfig: the model's head counts and family decide whether it can be
    # split (the layers' own rule, engine.model.parallel_layers); a bad value is refused there.
    if not isinstance(size, int) or isinstance(size, bool) or size <= 1:
        return
    from turnout.engine.model.parallel_layers import tensor_parallel_problem

    problem = tensor_parallel_problem(mc, size)
    if problem is not None:
        raise EngineConfigError(problem)


def _prefix_caching_for_state(mc: Any, kwargs: dict[str, Any]) -> None:
    # A prefix-cache hit skips tokens whose recurrent state no block holds (mamba_cache_mode
    # 'none'), so models with Mamba layers run without it, as vLLM does (its
    # MambaModelConfig.verify_and_update_config): said in the log, loudly when it was asked for.
    if not getattr(mc, "has_inner_state", False):
        return
    asked = kwargs.get("enable_prefix_caching")
    if asked is True:
        logger.warning(
            "enable_prefix_caching=True is not supported for %s: its Mamba layers keep one "
            "recurrent state per request (mamba_cache_mode='none'); prefix caching is off",
            mc.architecture,
        )
    elif asked is None:
        logger.info(
            "prefix caching is off for %s: its Mamba layers keep per-request state", mc.architecture
        )
    if asked is None or asked is True:
        kwargs["enable_prefix_caching"] = False


def _check_device_exists(device: str, tensor_parallel_size: int = 1) -> None:
    # torch would fail later with an AssertionError ("Torch not compiled with CUDA enabled")
    # or a CUDA error deep inside the model load.
    if not device.startswith("cuda"):
        return
    import torch

    index = device.partition(":")[2]
    if not torch.cuda.is_available():
        raise EngineConfigError(f"device {device!r}: CUDA is not available on this machine")
    if index.isdigit() and int(index) >= torch.cuda.device_count():
        raise EngineConfigError(
            f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if tensor_parallel_size > torch.cuda.device_count():
        raise EngineConfigError(
            f"tensor_parallel_size={tensor_parallel_size}: this machine has "
            f"{torch.cuda.device_count()} CUDA device(s), one per rank is needed"
        )


__all__ = ["engine_config_for", "read_model_config"]
