"""The old runner (MRV1 style): a CPU-side persistent batch prepared with numpy each step.

The engine builds it by name: ``importlib.import_module("turnout.runner_v1").create_model_runner(config)``
(see docs/engine.md). Runs on CPU without Triton; supports n-gram speculation, custom
per-request logits processors and ``cpu_offload_gb``. ``runner_v1.MANIFEST`` declares what it
serves (``engine.capabilities``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnout.engine.config import EngineConfig
    from turnout.runner_v1.model_runner import V1ModelRunner


def __getattr__(name: str) -> Any:
    # MANIFEST (engine.capabilities.RunnerManifest) is built in the hub, which loads torch:
    # only on first use, so that ``import runner_v1`` stays light.
    if name == "MANIFEST":
        from turnout.runner_v1.model_runner import MANIFEST

        return MANIFEST
    raise AttributeError(f"module 'turnout.runner_v1' has no attribute {name!r}")


def create_model_runner(config: EngineConfig) -> V1ModelRunner:
    """A runner_v1 model runner for ``config`` (call ``load_model()`` next)."""
    from turnout.runner_v1.model_runner import V1ModelRunner

    return V1ModelRunner(config)


__all__ = ["MANIFEST", "create_model_runner"]
