"""Runner-agnostic serving core: requests, sampling parameters, scheduler, KV-cache manager,
the runner protocol and the ``LLM`` facade. Torch is imported only under ``engine.model`` and by
the runner wiring, so the scheduling core runs and tests without it.

Names are exported lazily (PEP 562): ``import engine`` loads nothing else, so the ``turnout``
command line stays fast; ``from engine import LLM`` loads the facade (oracle, then torch
through the model layer) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "engine.llm",
    "EngineConfig": "engine.config",
    "SpeculativeConfig": "engine.config",
    "EngineCore": "engine.core",
    "EngineConfigError": "engine.errors",
    "EngineError": "engine.errors",
    "InvalidRequestError": "engine.errors",
    "UnsupportedOptionError": "engine.errors",
    "AsyncModelRunnerOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "EmbeddingOutput": "engine.outputs",
    "Logprob": "engine.outputs",
    "Logprobs": "engine.outputs",
    "ModelRunnerOutput": "engine.outputs",
    "PromptLogprobs": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "Request": "engine.request",
    "RequestStatus": "engine.request",
    "ModelRunner": "engine.runner_protocol",
    "SamplingParams": "engine.sampling_params",
    "Scheduler": "engine.scheduler",
    "CachedRequestData": "engine.scheduler_output",
    "NewRequestData": "engine.scheduler_output",
    "SchedulerOutput": "engine.scheduler_output",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
