"""What the engine must know about a model before loading it: its :class:`ModelConfig` (from
``config.json`` or the GGUF header), and the :class:`EngineConfig` that follows from it and
the caller's arguments. Part of the runner wiring: imports the model layer (and so torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import EngineConfig, SpeculativeConfig
from engine.errors import EngineConfigError


def read_model_config(model: str | Path) -> Any:  # -> engine.model.ModelConfig
    """The model's configuration without loading its weights.

    Raises:
        FileNotFoundError: no such directory / file.
        ModelConfigError: an unsupported or malformed configuration.
    """
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        from engine.model.gguf_loader import read_gguf

        return read_gguf(path)[0]  # the header only: tensors are read lazily
    from engine.model.loader import read_hf_config

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
        EngineConfigError: ``max_model_len`` above the model's ``max_position_embeddings``,
            or another bad value.
    """
    EngineConfig.check_field_names(set(kwargs))
    mc = model_config if model_config is not None else read_model_config(model)
    spec = kwargs.pop("speculative_config", None)
    if isinstance(spec, dict):
        spec = SpeculativeConfig.from_dict(spec)
    max_len = kwargs.pop("max_model_len", None) or mc.max_position_embeddings
    if max_len > mc.max_position_embeddings:
        raise EngineConfigError(
            f"max_model_len={max_len} is above the model's max_position_embeddings={mc.max_position_embeddings}"
        )
    eos = kwargs.pop("eos_token_ids", None)
    if eos is None:
        eos = tuple(mc.eos_token_ids) if not mc.is_encoder else ()
    # Prompts that cannot be chunked (encoders, chunked prefill off) must fit one step.
    cannot_chunk = mc.is_encoder or not kwargs.get("enable_chunked_prefill", True)
    kwargs.setdefault("max_num_batched_tokens", max(2048, max_len) if cannot_chunk else 2048)
    return EngineConfig(
        model=str(model), vocab_size=mc.vocab_size, max_model_len=max_len, eos_token_ids=tuple(eos),
        runner_kind="pooling" if mc.is_encoder else "generate", speculative_config=spec, **kwargs,
    )


__all__ = ["engine_config_for", "read_model_config"]
