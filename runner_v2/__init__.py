"""The new runner (MRV2 style): a GPU-resident request table, Triton input preparation and
asynchronous output. See docs/runner-v2.md.

The engine builds it by name: ``importlib.import_module("turnout.runner_v2").create_model_runner(config)``.
On CUDA its kernels are compiled; on CPU they run through the Triton interpreter (slow: tests
and smoke runs), which ``kernels/_triton.py`` selects on a machine without a GPU.
``runner_v2.MANIFEST`` declares what it serves (``engine.capabilities``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnout.engine.config import EngineConfig
    from turnout.runner_v2.runner import V2ModelRunner


def __getattr__(name: str) -> Any:
    # MANIFEST (engine.capabilities.RunnerManifest) is built in the hub, which loads torch and
    # the kernels: only on first use, so that ``import runner_v2`` stays light.
    if name == "MANIFEST":
        from turnout.runner_v2.runner import MANIFEST

        return MANIFEST
    raise AttributeError(f"module 'turnout.runner_v2' has no attribute {name!r}")


def create_model_runner(config: EngineConfig) -> V2ModelRunner:
    """A runner_v2 model runner for ``config`` (call ``load_model()`` next).

    Raises:
        EngineConfigError: an option the ``turnout`` pack says runner_v2 does not support, or a
            CPU device in a process where Triton compiles (a GPU machine without
            ``TRITON_INTERPRET=1``).
    """
    if not config.device.startswith("cuda"):
        _use_triton_interpreter()
    from turnout.runner_v2.runner import V2ModelRunner

    return V2ModelRunner(config)


def _use_triton_interpreter() -> None:
    from turnout.engine.errors import EngineConfigError
    from turnout.kernels._triton import INTERPRETED

    if not INTERPRETED:
        # Triton chose between compiling and interpreting when it was imported.
        raise EngineConfigError(
            "runner_v2 on the CPU runs its kernels through Triton's interpreter: start the "
            "process with TRITON_INTERPRET=1 (it is chosen by itself only on a machine without a GPU)"
        )


__all__ = ["MANIFEST", "create_model_runner"]
