"""The contract between the engine and a model runner (runner_v1, runner_v2).

A runner package exposes ``create_model_runner(config: EngineConfig) -> ModelRunner``; the
``LLM`` facade imports the package the oracle chose by name (``importlib``), never statically.
The engine calls, in order: ``load_model()``, ``kv_cache_block_bytes()`` and
``state_cache_bytes()`` (to size the cache),
``initialize_kv_cache(num_blocks)``, then ``execute_model()`` once per step.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from turnout.engine.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput

#: The runner packages of this build, by name (``runner_<name>``).
RUNNER_NAMES = ("v1", "v2")


@runtime_checkable
class ModelRunner(Protocol):
    """What the engine needs from a runner."""

    def load_model(self) -> None:
        """Load the weights (and apply features such as ``cpu_offload_gb``)."""

    def kv_cache_block_bytes(self) -> int:
        """Bytes one KV block takes over all layers (K and V)."""

    def available_kv_cache_bytes(self) -> int:
        """Memory the runner can give the KV cache after loading the model."""

    def state_cache_bytes(self) -> int:
        """Bytes of the per-request recurrent state of ``max_num_seqs`` requests (Mamba layers;
        0 for other models), allocated by ``initialize_kv_cache`` beside the blocks."""

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` blocks of ``block_size`` slots per layer."""

    def check_sampling_params(self, params: SamplingParams) -> None:
        """Refuse options this runner does not implement.

        Raises:
            UnsupportedOptionError: naming the option.
        """

    def execute_model(
        self, scheduler_output: SchedulerOutput
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Run one step: apply finished/preempted ids first, then bind new metadata, run the
        forward pass, sample, and return the results (or a handle to them)."""


__all__ = ["RUNNER_NAMES", "ModelRunner"]
