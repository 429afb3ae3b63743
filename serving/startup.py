"""Building the server's engine: the ``LLM`` (the oracle's runner decision, the model, the KV
cache), its registration with the rollout-control service, and what the front end needs to
know about it (:class:`EngineInfo`).

The same code runs where the engine core runs: in the server's process (one process, a thread
steps the core) or in the engine-core process (:mod:`~turnout.serving.core_client`).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnout.oracle.wire import engine_registration
from turnout.serving.args import ServeArgs
from turnout.serving.metrics import METRICS_RELEASE

logger = logging.getLogger("turnout.serving")

_OFF = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class EngineInfo:
    """What the front end knows of the engine once it loaded (picklable: it crosses from the
    engine-core process).

    Attributes:
        decision: the runner decision as JSON (``Decision.to_json()``).
        runner / mode / family / stage / policy_digest: the decision's fields (``mode`` is
            ``auto`` or ``pinned``).
        reasons: the decision's reasons, as labels.
        max_model_len: tokens per sequence at most (prompt plus output).
        runner_kind: ``generate`` or ``pooling``.
        pooling_tasks: what a pooling model serves (``embed``, ...).
        engine_id: the id registered with the rollout-control service (``None``: none).
    """

    decision: dict[str, Any]
    runner: str
    mode: str
    family: str
    stage: str
    policy_digest: str
    max_model_len: int
    runner_kind: str
    pooling_tasks: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    engine_id: str | None = None
    metrics_labels: dict[str, str] = field(default_factory=dict)


def auto_dtype(model: Path, device: str | None) -> str | None:
    """``--dtype auto`` as vLLM resolves it on a GPU (``_get_and_verify_dtype``,
    vllm/config/model.py): the model's ``torch_dtype`` when it is bfloat16 or float16, and
    float32 checkpoints downcast to bfloat16. On the CPU ``None``: the engine's float32.

    Raises:
        FileNotFoundError, ModelConfigError: the model's config cannot be read.
    """
    import torch

    from turnout.engine.model_info import read_model_config

    on_gpu = device == "cuda" or (device is None and torch.cuda.is_available())
    if not on_gpu:
        return None
    declared = str(getattr(read_model_config(model), "torch_dtype", None) or "")
    return declared if declared in ("bfloat16", "float16") else "bfloat16"


def build_llm(args: ServeArgs) -> Any:
    """The ``LLM`` the flags describe: the runner decided (or pinned), the model loaded.

    Raises:
        EngineConfigError, FileNotFoundError, ModelConfigError: what ``LLM`` raises.
    """
    from turnout.engine.llm import LLM  # torch and the runners: loaded where the core runs

    engine_args = args.engine_args()
    if "dtype" not in engine_args:  # --dtype auto
        dtype = auto_dtype(args.model, args.device)
        if dtype is not None:
            engine_args["dtype"] = dtype
    return LLM(
        args.model,
        args.runner,
        tokenizer=args.tokenizer,
        device=args.device,
        pack=args.pack,
        deployment_id=args.deployment_id,
        **engine_args,
    )


def engine_info(llm: Any, args: ServeArgs, engine_id: str | None) -> EngineInfo:
    """What the front end needs of a built ``LLM``."""
    decision = llm.decision
    return EngineInfo(
        decision=decision.to_json(),
        runner=str(decision.runner),
        mode=decision.mode,
        family=decision.family or "",
        stage=decision.stage or "",
        policy_digest=decision.policy_digest,
        max_model_len=llm.config.max_model_len,
        runner_kind=llm.config.runner_kind,
        pooling_tasks=tuple(llm.config.pooling_tasks),
        reasons=tuple(r.label for r in decision.reasons) if decision.reasons else (),
        engine_id=engine_id,
        metrics_labels={
            "runner": str(decision.runner),
            "mode": decision.mode,
            # as the canary split reads it: --deployment-id, TURNOUT_DEPLOYMENT_ID, the host
            "deployment": llm.deployment.deployment_id or socket.gethostname(),
            "family": decision.family or "",
            "stage": decision.stage or "",
            "policy_digest": decision.policy_digest,
        },
    )


def freeze_heap(where: str) -> None:
    """Move what loading made into the collector's permanent generation, so that a full
    collection while serving walks only what requests made (vLLM's ``freeze_gc_heap`` after
    start-up, vllm/utils/gc_utils.py since 0.11.1). ``TURNOUT_FREEZE_HEAP=0`` (or false, no,
    off) leaves the collector as Python has it."""
    if os.environ.get("TURNOUT_FREEZE_HEAP", "1").strip().lower() in _OFF:
        return
    gc.collect()
    gc.freeze()
    logger.info(
        "heap frozen (%s): %d objects in the collector's permanent generation",
        where,
        gc.get_freeze_count(),
    )


def register(args: ServeArgs, llm: Any) -> str | None:
    """Register this server with the rollout-control service (when ``TURNOUT_URL`` names
    one): its address and ``/metrics`` for Prometheus' service discovery, the decision it
    runs, its cohort; the client repeats it as a heartbeat. Returns the engine id, or None
    when nothing is reported."""
    client = llm.oracle_client
    if client is None:
        return None
    engine_id = f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        registration = engine_registration(
            llm.decision,
            llm.deployment,
            engine_id=engine_id,
            address=args.address(),
            engine="turnout",
            vllm_version=METRICS_RELEASE,
            pack=client.wire_pack,
            deployment_id=llm.deployment.deployment_id or client.host,
            host=client.host,
        )
    except ValueError as exc:  # the server serves; only Prometheus' discovery misses it
        logger.error("not registered with the rollout-control service: %s", exc)
        return None
    client.register_engine(registration)
    logger.info(
        "registered with the rollout-control service as %s at %s (%s, %s)",
        engine_id,
        registration.address,
        registration.cohort,
        registration.runner,
    )
    return engine_id


def unregister_and_shutdown(llm: Any, engine_id: str | None) -> None:
    """Leave the service's scrape targets at once, end reporting, stop the engine."""
    if engine_id is not None and llm.oracle_client is not None:
        llm.oracle_client.end_engine(engine_id)
    llm.shutdown()


__all__ = [
    "EngineInfo",
    "auto_dtype",
    "build_llm",
    "engine_info",
    "freeze_heap",
    "register",
    "unregister_and_shutdown",
]
