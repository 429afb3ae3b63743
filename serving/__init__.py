"""``turnout engine serve``: one engine behind the OpenAI API, as ``vllm serve`` serves it.

Modules, one idea each: :mod:`~turnout.serving.args` (the flags, vLLM's names),
:mod:`~turnout.serving.protocol` (the request bodies and OpenAI's error shape),
:mod:`~turnout.serving.async_engine` (the engine thread behind the event loop),
:mod:`~turnout.serving.detokenize` (incremental text and stop strings),
:mod:`~turnout.serving.metrics` (vLLM's Prometheus names), :mod:`~turnout.serving.app` (the
routes) and :mod:`~turnout.serving.server` (start-up, the runner decision, the drain).
docs/serving.md is the operator's guide.
"""
