"""Tokenizers from HF directories (tokenizer.json + tokenizer_config.json) and chat templates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from jinja2 import TemplateError
from minilm_path import minilm_dir

from turnout.engine.model.tokenizer import TokenizerError, load_tokenizer

transformers = pytest.importorskip("transformers")


def test_hf_dir_tokenizer_matches_transformers() -> None:
    tok = load_tokenizer(minilm_dir())
    ref = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    long_text = "word " * 300  # the file pads/truncates to 128: we must not
    for text in ["Hello World, this is MiniLM!", "naïve café", long_text]:
        assert tok.encode(text) == ref.encode(text)
    assert len(tok.encode(long_text)) == 302
    assert tok.decode(tok.encode("Hello World")) == "hello world"
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_from_tokenizer_config(tmp_path: Path) -> None:
    shutil.copy(minilm_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tools') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": template, "bos_token": "[CLS]", "eos_token": {"content": "[SEP]"}}
        )
    )
    tok = load_tokenizer(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id) == (101, 102)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "[CLS][user] hi[SEP]\n[assistant]"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "[CLS][user] hi[SEP]\n"
    with pytest.raises(TemplateError, match="no tools"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_missing_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
