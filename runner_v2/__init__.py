"""The new runner (MRV2 style): a GPU-resident request table, Triton input preparation and
asynchronous output. See docs/runner-v2.md.

The engine builds it by name: ``importlib.import_module("runner_v2").create_model_runner(config)``.
On CUDA its kernels are compiled; on CPU they run through the Triton interpreter (tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from runner_v2.runner import V2ModelRunner


def create_model_runner(config: EngineConfig) -> V2ModelRunner:
    """A runner_v2 model runner for ``config`` (call ``load_model()`` next).

    Raises:
        EngineConfigError: an option the ``turnout`` pack says runner_v2 does not support.
    """
    from runner_v2.runner import V2ModelRunner

    return V2ModelRunner(config)


__all__ = ["create_model_runner"]
