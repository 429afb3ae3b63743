"""The runner wiring: build a runner by name and an :class:`EngineCore` around it.

The engine never imports a runner package statically (docs/architecture.md §2): the package is
imported by name, ``turnout.runner_<name>``, and must expose ``create_model_runner(config) ->
ModelRunner``.
"""

from __future__ import annotations

import importlib
from typing import Any

from turnout.engine.config import EngineConfig
from turnout.engine.core import EngineCore
from turnout.engine.errors import EngineConfigError
from turnout.engine.kv_cache_manager import cdiv
from turnout.engine.runner_protocol import RUNNER_NAMES, ModelRunner

GIB = 1 << 30


def create_runner(name: str, config: EngineConfig) -> ModelRunner:
    """``turnout.runner_<name>.create_model_runner(config)``.

    Raises:
        EngineConfigError: an unknown runner name, or a package without the factory.
    """
    if name not in RUNNER_NAMES:
        raise EngineConfigError(
            f"unknown runner {name!r}: expected one of {', '.join(RUNNER_NAMES)}"
        )
    module: Any = importlib.import_module(f"turnout.runner_{name}")
    factory = getattr(module, "create_model_runner", None)
    if factory is None:
        raise EngineConfigError(f"runner_{name} does not provide create_model_runner(config)")
    runner: ModelRunner = factory(config)
    return runner


def determine_num_kv_blocks(config: EngineConfig, runner: ModelRunner) -> int:
    """KV blocks to allocate: ``config.num_kv_blocks`` if set, else as many as the memory
    budget (``kv_cache_memory_gb`` or the runner's available memory) holds after the recurrent
    state of ``max_num_seqs`` requests (models with Mamba layers), capped at what
    ``max_num_seqs`` requests of ``max_model_len`` tokens can use. An attention-free model's
    blocks take no memory: it gets that cap.

    Raises:
        EngineConfigError: the budget does not hold the recurrent state, or one request of
            ``max_model_len`` tokens.
    """
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    block_bytes = runner.kv_cache_block_bytes()
    state_bytes = runner.state_cache_bytes()
    if (
        block_bytes == 0 and state_bytes == 0
    ):  # an encoder keeps no KV cache; the scheduler still needs a pool
        return 1
    max_useful = config.max_num_seqs * config.max_num_blocks_per_req
    budget = (
        int(config.kv_cache_memory_gb * GIB)
        if config.kv_cache_memory_gb is not None
        else runner.available_kv_cache_bytes()
    )
    if state_bytes > budget:
        raise EngineConfigError(
            f"the KV cache budget ({budget / GIB:.3f} GiB) does not hold the recurrent state of "
            f"max_num_seqs={config.max_num_seqs} requests ({state_bytes / GIB:.3f} GiB): lower "
            f"max_num_seqs or raise kv_cache_memory_gb"
        )
    if block_bytes == 0:  # attention-free (Mamba): blocks cost nothing, the state bounds the batch
        return max_useful
    num_blocks = min((budget - state_bytes) // block_bytes, max_useful)
    needed = cdiv(config.max_model_len, config.block_size)
    if num_blocks < needed:
        raise EngineConfigError(
            f"the KV cache budget ({budget / GIB:.3f} GiB, {num_blocks} blocks of {block_bytes} bytes"
            f"{f' after {state_bytes / GIB:.3f} GiB of recurrent state' if state_bytes else ''}) "
            f"does not hold one request of max_model_len={config.max_model_len} tokens ({needed} blocks): "
            f"lower max_model_len or raise kv_cache_memory_gb"
        )
    return num_blocks


def build_engine_core(config: EngineConfig, runner_name: str) -> EngineCore:
    """Create the runner, load the model, size and allocate the KV cache, wrap it. With
    ``tensor_parallel_size > 1`` the runner is an ``engine.parallel.executor.
    TensorParallelRunner``: one process per rank, this one rank 0 (``core.shutdown()`` stops
    the others)."""
    if config.tensor_parallel_size > 1:
        if runner_name not in RUNNER_NAMES:  # before any process starts
            create_runner(runner_name, config)
        from turnout.engine.parallel.executor import TensorParallelRunner

        runner: ModelRunner = TensorParallelRunner(runner_name, config)
    else:
        runner = create_runner(runner_name, config)
    try:
        return start_engine_core(config, runner)
    except BaseException:
        shutdown = getattr(runner, "shutdown", None)
        if shutdown is not None:
            shutdown()
        raise


def start_engine_core(config: EngineConfig, runner: ModelRunner) -> EngineCore:
    """Load the model of a created runner, size and allocate its KV cache, wrap it."""
    runner.load_model()
    num_blocks = determine_num_kv_blocks(config, runner)
    runner.initialize_kv_cache(num_blocks)
    return EngineCore(config, runner, num_blocks)


__all__ = [
    "RUNNER_NAMES",
    "build_engine_core",
    "create_runner",
    "determine_num_kv_blocks",
    "start_engine_core",
]
