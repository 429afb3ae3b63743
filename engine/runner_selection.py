"""Asking the oracle which runner a deployment gets (once, at start-up), and logging the answer
in vLLM's shapes (docs/architecture.md §3.3): ``Using V2 Model Runner``, or a warning naming
every blocker."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineConfigError, NoRunnerError

logger = logging.getLogger("turnout.engine")

RUNNER_CHOICES = ("auto", "v1", "v2")


def _qualified_name(fn: Callable[..., Any] | str) -> str:
    if isinstance(fn, str):
        return fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def deployment_config(
    engine_config: EngineConfig,
    architecture: str,
    *,
    runner: str,
    pack: Any,
    logits_processors: Sequence[Callable[..., Any] | str] = (),
    deployment_id: str | None = None,
    environ: Mapping[str, str] | None = None,
    quantization: str = "none",
) -> Any:  # -> oracle.DeploymentConfig
    """The oracle's view of this deployment: the model, this machine, the features asked for,
    and the runner variable (``runner="v1"``/``"v2"`` pins it; ``"auto"`` keeps the process
    environment's value, if any).

    ``quantization`` is the weights' vLLM ``--quantization`` name
    (``ModelConfig.quantization_method``): ``"gguf"`` for every GGUF file (its tensors are
    dequantised on load, but the rollout's quantized stage is about the checkpoint, as in
    vLLM), ``"fp8"`` / ``"compressed-tensors"`` for FP8 checkpoints, ``"none"`` otherwise.

    Raises:
        EngineConfigError: an unknown ``runner`` value.
    """
    from turnout.oracle import DeploymentConfig

    if runner not in RUNNER_CHOICES:
        raise EngineConfigError(
            f"runner must be one of {', '.join(RUNNER_CHOICES)}, got {runner!r}"
        )
    environ = os.environ if environ is None else environ
    if runner == "auto":
        env = {pack.env_var: environ[pack.env_var]} if pack.env_var in environ else {}
    else:
        env = dict(pack.pin_env(runner))
    spec = engine_config.speculative_config
    return DeploymentConfig(
        model=engine_config.model,
        architecture=architecture,
        runner_kind=engine_config.runner_kind,
        quantization=quantization,
        platform="cuda" if engine_config.device.startswith("cuda") else "cpu",
        triton_available=importlib.util.find_spec("triton") is not None,
        speculative_method=spec.method if spec else "none",
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        cpu_offload_gb=engine_config.cpu_offload_gb,
        logits_processors=tuple(_qualified_name(fn) for fn in logits_processors),
        enable_prefix_caching=engine_config.enable_prefix_caching,
        mamba_cache_mode=engine_config.mamba_cache_mode,
        enforce_eager=engine_config.enforce_eager,
        tensor_parallel_size=engine_config.tensor_parallel_size,
        deployment_id=deployment_id,
        env=env,
    )


def choose_runner(
    config: Any, *, pack: Any, canaries: Any = None, client: Any = None
) -> Any:  # -> oracle.Decision
    """Decide once and log the decision's messages at their levels. With an
    ``oracle.client.OracleClient`` (and no ``canaries`` given) the client decides with the
    service's canary snapshot and spools the decision for the service.

    Raises:
        NoRunnerError: no runner can honour the deployment or the pin (the oracle's error,
            e.g. ``Model Runner V2 does not yet support: ...``).
        EngineConfigError: the runner variable has an invalid value.
    """
    from turnout.oracle import decide
    from turnout.oracle.errors import ErrorCode

    if client is not None and canaries is None:
        decision = client.decide(config, deployment_id=config.deployment_id)
    else:
        decision = decide(config, pack=pack, canaries=canaries)
        if client is not None:
            _report(client, decision, config)
    for message in decision.messages:
        logger.log(logging.getLevelName(message.level), message.message)
    logger.info(
        "runner %s (%s, %s; pack %s, policy %s)",
        decision.runner,
        decision.mode,
        decision.reason_code,
        decision.pack,
        decision.policy_digest,
    )
    if decision.runner is None:
        if decision.error_code == ErrorCode.INVALID_ENV:
            raise EngineConfigError(str(decision.error))
        raise NoRunnerError(f"no runner can serve this deployment: {decision.error}")
    return decision


def _report(client: Any, decision: Any, config: Any) -> None:
    try:
        client.report(decision, config, deployment_id=config.deployment_id or client.host)
    except OSError as err:  # a full disk must not stop the engine from starting
        logger.error("decision not reported: cannot write the spool (%s)", err)


__all__ = ["RUNNER_CHOICES", "choose_runner", "deployment_config"]
