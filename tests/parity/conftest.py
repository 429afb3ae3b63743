"""The parity suite (docs/architecture.md §5.5): one set of contracts, run over every runner that
exists.

``RUNNERS`` lists them; a new runner joins by adding its name here (it must be importable as
``turnout.runner_<name>`` with ``create_model_runner(config)``). Engines are built exactly as the
``LLM`` facade builds them, minus the oracle (the suite pins the runner).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from hf_moe import hf_moe_dir
from tiny_model_configs import TINY_DECODER_CONFIGS, TINY_MOE_CONFIGS

from turnout.engine.core import EngineCore
from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.request import Request
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams

#: The runners under test: every parity case runs on each.
RUNNERS = ["v1", "v2"]

#: A tiny Llama with a larger vocabulary and context, for logprob-memory and long-prompt tests.
WIDE_LLAMA: dict[str, Any] = {
    **TINY_DECODER_CONFIGS["llama"],
    "vocab_size": 8192,
    "max_position_embeddings": 2048,
}


@pytest.fixture(params=RUNNERS)
def runner_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fp32 random-weight HF directories of every tiny architecture (written once)."""
    out = {}
    for name, cfg in [*TINY_DECODER_CONFIGS.items(), ("wide-llama", WIDE_LLAMA)]:
        path = tmp_path_factory.mktemp(name)
        write_random_weights(cfg, path, dtype=torch.float32, seed=3)
        out[name] = path
    return out


@pytest.fixture(scope="session")
def moe_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fp32 checkpoints of the tiny MoE architectures, drawn and written by transformers."""
    return {name: hf_moe_dir(tmp_path_factory, name) for name in TINY_MOE_CONFIGS}


def make_engine(runner_name: str, model_dir: Path, **kwargs: Any) -> EngineCore:
    """An engine over ``runner_name`` (fp32 on CPU unless ``device``/``dtype`` are given)."""
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("kv_cache_memory_gb", 0.05)
    return build_engine_core(engine_config_for(model_dir, **kwargs), runner_name)


def run(
    core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, Request]:
    """Add every request, step to the end, return the finished requests by id."""
    for req_id, (prompt, params) in requests.items():
        core.add_request(req_id, prompt, params)
    return {r.req_id: r for r in core.run_until_done()}


def prompts_for(vocab_size: int, lengths: list[int], seed: int = 7) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in lengths]
