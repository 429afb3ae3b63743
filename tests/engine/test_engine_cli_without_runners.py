"""``turnout generate`` / ``turnout embed`` on an install without the runners extra: a message
that says how to install it and exit code 2, not an ImportError traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "model"))
ROOT = Path(__file__).resolve().parents[2]


def _turnout_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``turnout`` command line in a process where ``module`` cannot be imported."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from turnout.oracle.cli import main; main(sys.argv[1:])"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("generate", ["--model", "SmolLM2-135M-Instruct.Q4_1.gguf", "--prompt", "hi"]),
        ("embed", ["--model", "all-MiniLM-L6-v2", "--text", "hello"]),
    ],
)
def test_without_torch_the_command_says_how_to_install_the_runners(
    command: str, args: list[str]
) -> None:
    r = _turnout_without("torch", command, *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.startswith(
        f"error: turnout {command} needs the runners extra, and torch cannot be imported ("
    )
    assert r.stderr.rstrip().endswith(
        "install it with make install-runners (or: pip install -e '.[runners]')"
    )


def test_an_import_error_of_our_own_code_is_not_hidden() -> None:
    r = _turnout_without("turnout.engine.llm", "generate", "--model", "m.gguf", "--prompt", "hi")
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "make install-runners" not in r.stderr


@pytest.fixture
def chat_model(tmp_path: Path) -> Path:
    """A tiny random Llama with MiniLM's tokenizer and a chat template: the model is built and
    the decision printed before the template is rendered (SmolLM2 took ~15 s to load here)."""
    import torch
    from minilm_path import minilm_dir
    from tiny_model_configs import TINY_DECODER_CONFIGS

    from turnout.engine.model import write_random_weights

    cfg = {**TINY_DECODER_CONFIGS["llama"], "vocab_size": 30522}  # MiniLM's vocabulary
    write_random_weights(cfg, tmp_path, dtype=torch.float32, seed=1)
    shutil.copy(minilm_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
                "{% endfor %}"
            }
        )
    )
    return tmp_path


def test_without_jinja2_a_chat_prompt_says_how_to_install_the_runners(chat_model: Path) -> None:
    # The chat template is rendered per conversation: the missing module was reported as
    # "conversation 0: the chat template rejects it: ModuleNotFoundError ..." instead.
    r = _turnout_without(
        "jinja2", "generate", "--model", str(chat_model), "--prompt", "hi", "--max-tokens", "1"
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout.startswith("runner: "), "the model loads and is decided before the chat"
    assert "rejects it" not in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert r.stderr.startswith(
        "error: turnout generate needs the runners extra, and jinja2 cannot be imported ("
    ), r.stderr
