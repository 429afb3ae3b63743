"""GGUF files (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
the architecture from the header metadata, the tensors dequantised to float32 on read (the
``gguf`` package's ``dequantize``: Q4_0/Q4_1/Q8_0/K-quants/F16/BF16...) and renamed to HF names.

llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` of ``llama`` models so that
each head's rotary pairs are interleaved (GPT-J style) instead of split in halves (HF's
``rotate_half``); :func:`unpermute_qk` undoes it. ``qwen2``/``qwen3`` files are not permuted.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType, LlamaFileType, dequantize

from turnout.engine.model.config import ModelConfig, ModelConfigError
from turnout.engine.model.weights import WeightLoadError, WeightSource

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_PERMUTED_QK = {"llama"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def open_gguf(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """A ``gguf.GGUFReader`` over ``path`` and its header as Python values.

    The reader parses the whole header and lays out every tensor when it opens the file (about
    3 s for SmolLM2-135M's 49,152-token vocabulary on one core), so a cut or overwritten file
    fails here, with whatever error the bytes lead the parser to (``ValueError``,
    ``IndexError``, ``struct.error``, ...). The model config, the weights and the tokenizer all
    read the same file; the last parse is kept (keyed by the resolved path and the file's
    inode, size and modification time, so a rewritten file is parsed again) and each caller
    gets its own copy of the header dict.

    Raises:
        ModelConfigError: the file is not a readable GGUF file (the path is named).
        OSError: the path cannot be read (missing, a directory without permission...).
    """
    resolved = Path(path).resolve()
    st = resolved.stat()
    try:
        reader, meta = _parse_gguf(str(resolved), st.st_ino, st.st_size, st.st_mtime_ns)
    except Exception as exc:  # any parse failure means the same to the caller
        raise ModelConfigError(
            f"{path}: not a readable GGUF file (truncated or corrupt): {type(exc).__name__}: {exc}"
        ) from exc
    return reader, dict(meta)


class PlainGGUFReader(GGUFReader):
    """``gguf.GGUFReader`` reading through a plain ``numpy.ndarray`` view of its memory map.

    The reader slices its ``np.memmap`` once per header value and tensor (about 250,000 slices
    for a 49,152-token vocabulary). Each slice of a memmap is itself a memmap, built through
    ``memmap.__array_finalize__``; measured on SmolLM2-135M that bookkeeping is 3.5 of the
    parse's 4.8 s. A plain view of the same pages gives the same bytes, values and tensor
    arrays (the view keeps the map alive through ``.base``) without it.
    """

    # The base class types ``data`` as np.memmap; not being one is the point of the change.
    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain_data = value.view(np.ndarray)


@functools.lru_cache(maxsize=2)
def _parse_gguf(resolved: str, inode: int, size: int, mtime_ns: int) -> tuple[Any, dict[str, Any]]:
    """The parse behind :func:`open_gguf`; the stat fields are only the cache key (a failed
    parse is not cached)."""
    reader = PlainGGUFReader(resolved)
    return reader, gguf_metadata(reader)


def gguf_metadata(reader: Any) -> dict[str, Any]:
    """Header key/values of a ``gguf.GGUFReader`` as Python values (strings decoded)."""
    return {name: _field_value(field) for name, field in reader.fields.items()}


def _field_value(field: Any) -> Any:
    if not field.types:
        return None

    def decode(part: np.ndarray, kind: Any) -> Any:
        return bytes(part).decode("utf-8") if kind == GGUFValueType.STRING else part.tolist()[0]

    if field.types[0] == GGUFValueType.ARRAY:
        return [decode(field.parts[i], field.types[-1]) for i in field.data]
    return decode(field.parts[field.data[0]], field.types[0])


def read_gguf(path: str | Path) -> tuple[ModelConfig, WeightSource]:
    """The :class:`ModelConfig` and lazy HF-named float32 tensors of a GGUF file.

    Raises:
        ModelConfigError: the file is truncated or corrupt, or its architecture or a header
            field is not supported.
        WeightLoadError: a tensor without an HF counterpart (e.g. ``rope_freqs``).
    """
    reader, meta = open_gguf(path)
    arch = meta.get("general.architecture")
    config = config_from_gguf(
        meta, has_output=any(t.name == "output.weight" for t in reader.tensors)
    )
    config = replace(config, quantization=gguf_quantization(reader, meta))
    source: dict[str, Callable[[], torch.Tensor]] = {}
    for tensor in reader.tensors:
        hf_name = hf_tensor_name(tensor.name)
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        num_heads = heads.get(part) if arch in _PERMUTED_QK else None
        source[hf_name] = functools.partial(_dequantize, tensor, num_heads)
    return config, source


@dataclass(frozen=True)
class GGUFQuantization:
    """The quantization of a GGUF file: ``general.file_type`` (llama.cpp's ``LlamaFileType``
    name, e.g. ``MOSTLY_Q4_1``; ``None`` when the header has none) and the count of tensors of
    each ``GGMLQuantizationType`` (most frequent first). ``method`` is ``"gguf"``, vLLM's
    ``--quantization`` name for every GGUF file."""

    file_type: str | None
    tensor_types: tuple[tuple[str, int], ...]

    @property
    def method(self) -> str:
        return "gguf"

    def describe(self) -> str:
        types = ", ".join(f"{n} {t}" for t, n in self.tensor_types)
        return f"file type {self.file_type or 'not stated'}; tensors: {types}"


def gguf_quantization(reader: Any, meta: dict[str, Any]) -> GGUFQuantization:
    """The :class:`GGUFQuantization` of an open file (header and tensor infos only)."""

    code = meta.get("general.file_type")
    try:
        file_type = LlamaFileType(code).name if code is not None else None
    except ValueError:  # a type newer than the installed gguf package
        file_type = f"file type {code}"
    counts = Counter(t.tensor_type.name for t in reader.tensors)
    return GGUFQuantization(
        file_type, tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    )


def config_from_gguf(meta: dict[str, Any], *, has_output: bool) -> ModelConfig:
    """HF-style config of a GGUF header (``{arch}.*`` keys and ``tokenizer.ggml.*`` ids).

    Raises:
        ModelConfigError: unsupported architecture or RoPE scaling, or a missing key.
    """
    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ModelConfigError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(_ARCHITECTURES)}"
        )

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelConfigError(f"GGUF header lacks `{arch}.{name}`")
        return value

    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    rope_scaling = None
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    elif scaling_type != "none":
        raise ModelConfigError(f"GGUF rope.scaling.type {scaling_type!r} is not supported")
    heads = key("attention.head_count")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    hf = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": meta.get(f"{arch}.attention.key_length") or key("embedding_length") // heads,
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base", 10000.0),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": not has_output,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    return ModelConfig.from_hf_dict(hf)


def hf_tensor_name(gguf_name: str) -> str:
    """HF name of a GGUF tensor name (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.
    q_proj.weight``).

    Raises:
        WeightLoadError: the tensor has no HF counterpart in the supported architectures.
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise WeightLoadError(
        f"GGUF tensor {gguf_name!r} has no counterpart in the model layer "
        "(Llama 3 rope_freqs and other extras are not supported)"
    )


def _dequantize(tensor: Any, permuted_heads: int | None) -> torch.Tensor:

    array = dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # ggml lists dims inner-first
    weight = torch.from_numpy(np.require(array, np.float32, ["C", "W"])).reshape(shape)
    return unpermute_qk(weight, permuted_heads) if permuted_heads else weight


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation.

    ``convert_hf_to_gguf.py`` reorders each head's rows from ``[x_0..x_{d/2-1}, y_0..]``
    (halves) to ``[x_0, y_0, x_1, y_1, ...]`` (pairs); this maps pairs back to halves.
    ``weight``: ``[num_heads * head_dim, ...]`` (a weight matrix or a bias).
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )
