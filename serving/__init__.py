"""``turnout engine serve``: one engine behind the OpenAI API, as ``vllm serve`` serves it.

Modules, one idea each: :mod:`~turnout.serving.args` (the flags, vLLM's names),
:mod:`~turnout.serving.protocol` (the request bodies and OpenAI's error shape),
:mod:`~turnout.serving.startup` (building the engine and what the front end knows of it),
:mod:`~turnout.serving.core_loop` (the core stepped, one update per step),
:mod:`~turnout.serving.core_client` (where the core runs: its own process, or a thread),
:mod:`~turnout.serving.async_engine` (the front end: updates into streams),
:mod:`~turnout.serving.detokenize` (incremental text and stop strings),
:mod:`~turnout.serving.metrics` (vLLM's Prometheus names), :mod:`~turnout.serving.app` (the
routes) and :mod:`~turnout.serving.server` (start-up, the runner decision, the drain).
docs/serving.md is the operator's guide.
"""
