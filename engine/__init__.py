"""Runner-agnostic serving core: requests, sampling parameters, scheduler, KV-cache manager,
the runner protocol and the ``LLM`` facade. Torch is imported only under ``engine.model`` and by
the runner wiring, so the scheduling core runs and tests without it.

Names are exported lazily (PEP 562): ``import engine`` loads nothing else, so the ``turnout``
command line stays fast; ``from turnout.engine import LLM`` loads the facade (oracle, then torch
through the model layer) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "turnout.engine.llm",
    "EngineConfig": "turnout.engine.config",
    "SpeculativeConfig": "turnout.engine.config",
    "EngineCore": "turnout.engine.core",
    "EngineConfigError": "turnout.engine.errors",
    "EngineError": "turnout.engine.errors",
    "InvalidRequestError": "turnout.engine.errors",
    "UnsupportedOptionError": "turnout.engine.errors",
    "AsyncModelRunnerOutput": "turnout.engine.outputs",
    "CompletionOutput": "turnout.engine.outputs",
    "EmbeddingOutput": "turnout.engine.outputs",
    "Logprob": "turnout.engine.outputs",
    "Logprobs": "turnout.engine.outputs",
    "ModelRunnerOutput": "turnout.engine.outputs",
    "PromptLogprobs": "turnout.engine.outputs",
    "RequestOutput": "turnout.engine.outputs",
    "Request": "turnout.engine.request",
    "RequestStatus": "turnout.engine.request",
    "ModelRunner": "turnout.engine.runner_protocol",
    "SamplingParams": "turnout.engine.sampling_params",
    "Scheduler": "turnout.engine.scheduler",
    "CachedRequestData": "turnout.engine.scheduler_output",
    "NewRequestData": "turnout.engine.scheduler_output",
    "SchedulerOutput": "turnout.engine.scheduler_output",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
