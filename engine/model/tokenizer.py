"""Tokenizers from an HF directory (``tokenizer.json`` + ``tokenizer_config.json``) or from a
GGUF header (``tokenizer.ggml.*``), with the chat template rendered by jinja2 in a sandbox
(as HF's ``apply_chat_template``).

GGUF byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are rebuilt with the
``tokenizers`` package; the pre-tokenizer follows ``tokenizer.ggml.pre`` as llama.cpp's
``llama-vocab.cpp`` does (e.g. ``smollm`` splits digits one by one before the GPT-2 pattern).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

# Split patterns of byte-level BPE vocabularies, from the models' own tokenizer.json files.
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PATTERNS = {
    "llama3": _LLAMA3_PATTERN,
    "llama-bpe": _LLAMA3_PATTERN,
    "qwen2": _QWEN2_PATTERN,
    "deepseek-r1-qwen": _QWEN2_PATTERN,
}
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell")  # llama.cpp groups these
_GPT2 = ("default", "gpt2", "")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


class TokenizerError(ValueError):
    """The tokenizer files cannot be used (what is missing or unsupported is named)."""


class Tokenizer:
    """Text <-> token ids, plus the model's chat template.

    Attributes:
        eos_token_id / bos_token_id: ids of the end/begin-of-sequence tokens (``None`` if
            the files name none).
        chat_template: the jinja2 source, or ``None``.
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token: str | None,
        eos_token: str | None,
        chat_template: str | None,
    ) -> None:
        self._backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = backend.token_to_id(eos_token) if eos_token else None
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        """Entries of the vocabulary, added tokens included."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the post-processor (BOS, or
        BERT's [CLS]/[SEP]). A rendered chat template already holds its special tokens: encode
        it with ``add_special_tokens=False``."""
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        """Token ids and token type ids of a text pair, as HF's ``tokenizer(first, second)``
        (BERT: ``[CLS] first [SEP] second [SEP]``, types 0 up to the first ``[SEP]``, then 1)."""
        encoding = self._backend.encode(first, second, add_special_tokens=True)
        return list(encoding.ids), list(encoding.type_ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (special tokens dropped unless ``skip_special_tokens=False``)."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with the chat template.

        Raises:
            TokenizerError: the model ships no chat template.
            jinja2.TemplateError: the template rejects the messages (its own message).
        """
        if not self.chat_template:
            raise TokenizerError("this model has no chat template; encode the prompt directly")
        return _render(
            self.chat_template,
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )


def _render(template: str, **context: Any) -> str:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
        x, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**context)


def load_tokenizer(source: str | Path) -> Tokenizer:
    """The tokenizer of an HF model directory or a ``.gguf`` file.

    Raises:
        FileNotFoundError: no such path, or the directory has no ``tokenizer.json``.
        TokenizerError: a GGUF vocabulary type or pre-tokenizer that is not supported, or an
            unreadable ``tokenizer.json`` / ``tokenizer_config.json`` (the file is named).
        ModelConfigError: the ``.gguf`` file is truncated or corrupt.
    """
    path = Path(source)
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    return _from_hf_dir(path)


def _from_hf_dir(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    try:
        backend = Backend.from_file(str(path / "tokenizer.json"))
    except Exception as exc:  # the tokenizers package raises a bare Exception
        raise TokenizerError(
            f"{path / 'tokenizer.json'}: not a readable tokenizer file: {exc}"
        ) from exc
    backend.no_padding()  # the file may fix a padded length (MiniLM: 128); callers pad
    backend.no_truncation()
    config_path = path / "tokenizer_config.json"
    try:
        config = (
            json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{config_path}: not a readable JSON file: {exc}") from exc
    if not isinstance(config, dict):
        raise TokenizerError(
            f"{config_path}: expected a JSON object, got a {type(config).__name__}"
        )
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    return Tokenizer(
        backend,
        bos_token=_token(config.get("bos_token")),
        eos_token=_token(config.get("eos_token")),
        chat_template=template,
    )


def _token(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _from_gguf(path: Path) -> Tokenizer:
    from turnout.engine.model.gguf_loader import open_gguf

    _, meta = open_gguf(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(
            f"{path.name}: GGUF tokenizer model {kind!r} is not supported "
            "(byte-level BPE 'gpt2' is); use the model's tokenizer.json"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    backend = _byte_level_bpe(
        tokens,
        meta.get("tokenizer.ggml.merges") or [],
        str(meta.get("tokenizer.ggml.pre") or ""),
        path.name,
    )
    types = meta.get("tokenizer.ggml.token_type") or []
    _add_special_tokens(backend, tokens, types)

    def token(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if idx is not None else None

    bos = token("bos")
    if meta.get("tokenizer.ggml.add_bos_token") and bos:
        from tokenizers.processors import TemplateProcessing

        bos_id = tokens.index(bos)
        backend.post_processor = TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)]
        )
    return Tokenizer(
        backend,
        bos_token=bos,
        eos_token=token("eos"),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str, name: str) -> Any:
    from tokenizers import Regex, decoders, pre_tokenizers
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = cast("list[tuple[str, str]]", [tuple(m.split(" ", 1)) for m in merges])
    backend = Backend(BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        steps = [pre_tokenizers.Digits(individual_digits=True), byte_level]
    elif pre in _SPLIT_PATTERNS:
        steps = [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERNS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    elif pre in _GPT2:
        steps = [byte_level]
    else:
        raise TokenizerError(f"{name}: GGUF pre-tokenizer {pre!r} is not supported")
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    return backend


def _add_special_tokens(backend: Any, tokens: list[str], types: list[int]) -> None:
    from tokenizers import AddedToken

    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _USER_DEFINED
    ]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
