"""``turnout engine serve MODEL``: start-up, the runner decision, and the drain on SIGTERM.

The HTTP server listens at once; the model loads in a thread behind it (``/ready`` is 503 and
``/v1/*`` answers 503 with ``Retry-After`` until it is in). Loading builds the engine the way
``LLM`` does: the oracle decides the runner for this deployment (with the rollout-control
service's canaries when ``TURNOUT_URL`` is set, else the pack's defaults, exactly as ``turnout
launch`` decides), the decision is logged, reported to the service with the engine's health,
shown in ``/v1/models`` and sent as ``x-turnout-runner`` on every answer. ``--runner v1|v2``
pins it by hand (reported with ``mode: pinned``). A kill switch or a canary flip reaches a
server when it restarts.

SIGTERM (or SIGINT) drains: readiness turns false and new ``/v1`` requests get 503, while the
requests in flight, streams included, run to their end; when none is left, or
``--drain-timeout`` seconds have passed (the ones still running are then aborted, their
streams ending with ``finish_reason: "abort"``), the server closes and the process exits 0.
A second signal exits at once.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from turnout.oracle.wire import engine_registration
from turnout.serving.app import ServerState, create_app
from turnout.serving.args import ServeArgs
from turnout.serving.async_engine import AsyncEngine
from turnout.serving.metrics import METRICS_RELEASE, ServingMetrics

logger = logging.getLogger("turnout.serving")

EXIT_OK = 0
EXIT_LOAD_FAILED = 3


def turnout_version() -> str:
    try:
        return version("turnout")
    except PackageNotFoundError:
        return "unknown"


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


def load_engine(args: ServeArgs, state: ServerState) -> None:
    """Build the LLM (the runner decision included), its async engine and metrics, and mark
    the state ready.

    Raises:
        EngineConfigError, FileNotFoundError, ModelConfigError: what ``LLM`` raises.
    """
    from turnout.engine.llm import LLM  # torch and the runners: loaded in the loading thread

    engine_args = args.engine_args()
    if "dtype" not in engine_args:  # --dtype auto
        dtype = auto_dtype(args.model, args.device)
        if dtype is not None:
            engine_args["dtype"] = dtype
    llm = LLM(
        args.model,
        args.runner,
        tokenizer=args.tokenizer,
        device=args.device,
        pack=args.pack,
        deployment_id=args.deployment_id,
        **engine_args,
    )
    decision = llm.decision
    info = {
        "runner": str(decision.runner),
        "mode": decision.mode,
        "deployment": args.deployment_id or "",
        "family": decision.family or "",
        "stage": decision.stage or "",
        "policy_digest": decision.policy_digest,
    }
    metrics = ServingMetrics(state.served_model_names[0], llm.config.max_model_len, info)
    engine = AsyncEngine(
        llm.core,
        llm.tokenizer,
        metrics,
        recorder=llm.health_recorder,
        max_num_queued_reqs=args.max_num_queued_reqs,
    )
    # The model, the tokenizer and torch are in: move them into the collector's permanent
    # generation, so that a full collection in the step loop walks only what requests made
    # (vLLM's freeze_gc_heap after start-up, vllm/utils/gc_utils.py since 0.11.1).
    # TURNOUT_FREEZE_HEAP=0 (or false, no, off) leaves the collector as Python has it, as
    # for `turnout serve`.
    if os.environ.get("TURNOUT_FREEZE_HEAP", "1").strip().lower() not in _OFF:
        gc.collect()
        gc.freeze()
        logger.info(
            "heap frozen: %d objects in the collector's permanent generation", gc.get_freeze_count()
        )
    engine.start()
    state.llm, state.engine, state.metrics = llm, engine, metrics
    state.engine_id = register(args, llm)
    state.decision = decision.to_json()
    state.max_model_len = llm.config.max_model_len
    state.runner_header = str(decision.runner)
    state.ready = True
    reasons = "; ".join(r.label for r in decision.reasons) if decision.reasons else ""
    logger.info(
        "serving %s on runner %s (%s%s%s)",
        state.served_model_names[0],
        decision.runner,
        "pinned by --runner" if decision.mode == "pinned" else "chosen by the oracle",
        f", stage {decision.stage}" if decision.stage else "",
        f": {reasons}" if reasons else "",
    )


_OFF = frozenset({"0", "false", "no", "off"})


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


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM starting a drain instead of closing the sockets at once."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        self._drain_started: float | None = None
        self._aborted = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in uvicorn's captured signals: it would raise the signal again after
        # the shutdown and the process would die of it instead of exiting 0.
        if self._drain_started is not None or not self.state.ready:
            self.force_exit = self._drain_started is not None
            self.should_exit = True
            return
        self._drain_started = time.monotonic()
        self.state.draining = True
        logger.info(
            "%s: draining %d requests in flight (at most %g s); new requests get 503",
            signal.Signals(sig).name,
            self.state.num_in_flight,
            self.drain_timeout_s,
        )

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self._drain_started is None:
            return False
        if self.state.num_in_flight == 0:
            logger.info("drained: every request finished")
            return True
        if time.monotonic() - self._drain_started < self.drain_timeout_s:
            return False
        if not self._aborted:
            self._aborted = True
            engine = self.state.engine
            logger.warning(
                "drain timeout (%g s): aborting %d requests still in flight",
                self.drain_timeout_s,
                self.state.num_in_flight,
            )
            if engine is not None:
                engine.abort_all()
            self._drain_started = time.monotonic() - self.drain_timeout_s + 2.0  # 2 s to end
            return False
        return True


def serve(args: ServeArgs) -> int:
    """Run the server until it is drained; the process's exit status."""
    state = ServerState(
        served_model_names=args.served_model_names(),
        api_keys=frozenset(args.api_key or ()),
        model_path=str(args.model),
        version=turnout_version(),
    )
    app = create_app(state)
    config = uvicorn.Config(
        app,
        host=args.host if args.host is not None else "0.0.0.0",
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=5,
        lifespan="off",
    )
    server = DrainingServer(config, state, args.drain_timeout)
    failure: list[BaseException] = []

    def load() -> None:
        try:
            load_engine(args, state)
        except BaseException as exc:  # said in the log and by the exit status
            failure.append(exc)
            state.load_error = f"{type(exc).__name__}: {exc}"
            logger.error("the model failed to load: %s", state.load_error)
            server.should_exit = True

    loader = threading.Thread(target=load, name="turnout-load", daemon=True)
    loader.start()
    server.run()
    loader.join(timeout=1.0)
    if state.engine is not None:
        state.engine.stop()
    if state.llm is not None and state.engine_id is not None:
        state.llm.oracle_client.end_engine(state.engine_id)  # leaves the targets at once
    if state.llm is not None:
        state.llm.shutdown()
    return EXIT_LOAD_FAILED if failure else EXIT_OK


__all__ = ["EXIT_LOAD_FAILED", "DrainingServer", "load_engine", "serve"]
