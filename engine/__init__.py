"""Runner-agnostic serving core: requests, sampling parameters, scheduler, KV-cache manager,
the runner protocol and the ``LLM`` facade. Torch is imported only under ``engine.model`` and by
the runner wiring, so the scheduling core runs and tests without it.

``from engine import SamplingParams, EngineCore`` loads only the core; ``LLM`` (which needs the
oracle, and torch through the model layer) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.errors import (
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    UnsupportedOptionError,
)
from engine.outputs import (
    AsyncModelRunnerOutput,
    CompletionOutput,
    EmbeddingOutput,
    Logprob,
    Logprobs,
    ModelRunnerOutput,
    PromptLogprobs,
    RequestOutput,
)
from engine.request import Request, RequestStatus
from engine.runner_protocol import ModelRunner
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "LLM",
    "AsyncModelRunnerOutput",
    "CachedRequestData",
    "CompletionOutput",
    "EmbeddingOutput",
    "EngineConfig",
    "EngineConfigError",
    "EngineCore",
    "EngineError",
    "InvalidRequestError",
    "Logprob",
    "Logprobs",
    "ModelRunner",
    "ModelRunnerOutput",
    "NewRequestData",
    "PromptLogprobs",
    "Request",
    "RequestOutput",
    "RequestStatus",
    "SamplingParams",
    "Scheduler",
    "SchedulerOutput",
    "SpeculativeConfig",
    "UnsupportedOptionError",
]
