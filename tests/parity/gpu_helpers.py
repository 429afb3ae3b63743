"""What the CUDA parity tests share: an engine on the GPU, a batch run to completion, seeded
prompts, and freeing the GPU between engines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from turnout.engine.core import EngineCore
from turnout.engine.model_info import engine_config_for
from turnout.engine.request import Request
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams


def make_core(runner: str, path: Path, dtype: str, **kwargs: Any) -> EngineCore:
    """An engine on CUDA for ``path`` (defaults: max_model_len 512, 16 sequences, 4 GB of KV
    cache; ``kwargs`` are EngineConfig fields)."""
    kwargs.setdefault("max_model_len", 512)
    kwargs.setdefault("max_num_seqs", 16)
    kwargs.setdefault("kv_cache_memory_gb", 4.0)
    return build_engine_core(engine_config_for(path, device="cuda", dtype=dtype, **kwargs), runner)


def run(
    core: EngineCore, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
) -> list[Request]:
    """Every prompt (request ``r{i}``) run to completion; the finished requests in order."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(f"r{i}", prompt, p)
    done = {r.req_id: r for r in core.run_until_done()}
    return [done[f"r{i}"] for i in range(len(prompts))]


def prompts_for(vocab_size: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Seeded random prompts of ``lengths`` tokens in ``[3, vocab_size)``."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def free() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
