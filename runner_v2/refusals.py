"""What runner_v2 refuses, in the words of the ``turnout`` policy pack.

The pack (``policies/turnout/capability_matrix.yaml``) lists the configurations runner_v2 does
not support; a deployment pinned to V2 with one of them is an error there. The runner refuses
the same options itself when it is built (or, for per-request options, when a request is
added), with the pack's rule labels in the pack's pinned message shape, so that nothing reaches
runner_v2 and is silently ignored. ``tests/runner_v2/test_pack_agreement.py`` checks these
labels against the pack and builds every blocker's configuration.

Only the blockers that an :class:`~engine.config.EngineConfig` or a request can express are
here; the others (stock torch.compile, sequence parallelism, DBO, ...) are options turnout's
engine implements for no runner and refuses before any runner is built.
"""

from __future__ import annotations

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineConfigError
from turnout.kernels._triton import HAS_TRITON

#: Rule id in the turnout pack -> its label (``{speculative_method}`` filled in).
LABELS: dict[str, str] = {
    "cpu_offload": "CPU weight offload (cpu_offload_gb > 0)",
    "ngram_speculation": "speculative method '{speculative_method}'",
    "custom_logits_processors": "custom logits processors",
}
#: Feature (``engine.capabilities.FEATURES``) -> the rule whose label the refusal uses. The
#: manifest's ``refused`` list is these keys (``runner_v2.runner.MANIFEST``).
REFUSED_FEATURES: dict[str, str] = {
    "cpu_offload": "cpu_offload",
    "logits_processors": "custom_logits_processors",
}
#: Speculative methods refused at construction: ``ngram`` proposes from the CPU token history,
#: which runner_v2 keeps on the device (its ``ngram_gpu`` matches there instead). runner_v2
#: implements ``ngram_gpu`` and ``draft_model`` (``runner_v2/spec_decode.py``); the engine's
#: ``SpeculativeConfig`` refuses every method it cannot express before any runner is built.
REFUSED_SPECULATIVE_METHODS = ("ngram",)
#: The pack's error for a V2 pin without Triton (rule ``triton_required``).
TRITON_REQUIRED = "Model Runner V2 requires Triton."
_PINNED = "Model Runner V2 does not yet support: {}"


def blockers(config: EngineConfig) -> list[str]:
    """Rule ids of the pack's V2 blockers that ``config`` matches."""
    found = []
    if config.cpu_offload_gb > 0:
        found.append(REFUSED_FEATURES["cpu_offload"])
    spec = config.speculative_config
    if spec is not None and spec.method in REFUSED_SPECULATIVE_METHODS:
        found.append("ngram_speculation")
    return found


def check_engine_config(config: EngineConfig) -> None:
    """Refuse a configuration runner_v2 does not support.

    Raises:
        EngineConfigError: Triton is missing, or ``config`` matches V2 blockers of the pack
            (the message lists every one by its label).
    """
    if not HAS_TRITON:
        raise EngineConfigError(TRITON_REQUIRED)
    found = blockers(config)
    if found:
        method = config.speculative_config.method if config.speculative_config is not None else ""
        labels = [LABELS[rule].format(speculative_method=method) for rule in found]
        raise EngineConfigError(_PINNED.format(", ".join(labels)))


def logits_processors_message() -> str:
    """The refusal of a request with custom logits processors (rule ``custom_logits_processors``),
    naming the option."""
    return (
        _PINNED.format(LABELS[REFUSED_FEATURES["logits_processors"]])
        + " (SamplingParams.logits_processors)"
    )


__all__ = [
    "LABELS",
    "REFUSED_FEATURES",
    "REFUSED_SPECULATIVE_METHODS",
    "TRITON_REQUIRED",
    "blockers",
    "check_engine_config",
    "logits_processors_message",
]
