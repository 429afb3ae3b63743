"""Runner-agnostic serving core: requests, sampling parameters, scheduler, KV-cache manager,
the runner protocol and the ``LLM`` facade. Torch is imported only under ``engine.model`` and by
the runner wiring, so the scheduling core runs and tests without it."""
