"""``turnout engine serve MODEL``: start-up, the runner decision, and the drain on SIGTERM.

The HTTP server listens at once; the model loads in a thread behind it (``/ready`` is 503 and
``/v1/*`` answers 503 with ``Retry-After`` until it is in). Loading builds the engine the way
``LLM`` does, in the engine-core process (:mod:`~turnout.serving.core_client`; a thread of
this process with ``TURNOUT_ENABLE_MULTIPROCESSING=0``): the oracle decides the runner for this deployment (with the rollout-control
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

import logging
import signal
import threading
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from types import FrameType
from typing import Any

import uvicorn

from turnout.engine.llm import load_tokenizer_for
from turnout.serving.app import ServerState, create_app
from turnout.serving.args import ServeArgs
from turnout.serving.async_engine import AsyncEngine
from turnout.serving.core_client import STOP_TIMEOUT_S, load_core, multiprocessing_enabled
from turnout.serving.metrics import ServingMetrics
from turnout.serving.startup import freeze_heap

logger = logging.getLogger("turnout.serving")

EXIT_OK = 0
EXIT_LOAD_FAILED = 3


def turnout_version() -> str:
    try:
        return version("turnout")
    except PackageNotFoundError:
        return "unknown"


def load_engine(
    args: ServeArgs, state: ServerState, on_spawn: Callable[[Any], None] | None = None
) -> None:
    """Build the engine (the runner decision included) where
    ``TURNOUT_ENABLE_MULTIPROCESSING`` says, its front end and metrics, and mark the state
    ready.

    Raises:
        EngineLoadError: the engine-core process could not build it (its message).
        EngineConfigError, FileNotFoundError, ModelConfigError: what ``LLM`` raises.
    """
    # Before the weights: a tokenizer that cannot be read fails fast.
    tokenizer = load_tokenizer_for(
        args.tokenizer if args.tokenizer is not None else args.model,
        explicit=args.tokenizer is not None,
    )
    core = load_core(args, on_spawn)
    info = core.info
    metrics = ServingMetrics(state.served_model_names[0], info.max_model_len, info.metrics_labels)
    engine = AsyncEngine(core, tokenizer, metrics, max_num_queued_reqs=args.max_num_queued_reqs)
    if multiprocessing_enabled():
        freeze_heap("server")
    engine.start()
    state.info, state.tokenizer, state.engine, state.metrics = info, tokenizer, engine, metrics
    state.engine_id = info.engine_id
    state.decision = info.decision
    state.max_model_len = info.max_model_len
    state.runner_header = info.runner
    state.ready = True
    reasons = "; ".join(info.reasons)
    logger.info(
        "serving %s on runner %s (%s%s%s)",
        state.served_model_names[0],
        info.runner,
        "pinned by --runner" if info.mode == "pinned" else "chosen by the oracle",
        f", stage {info.stage}" if info.stage else "",
        f": {reasons}" if reasons else "",
    )


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM starting a drain instead of closing the sockets at once."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        self._drain_started: float | None = None
        self._aborted = False
        self.stopped_while_loading = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in uvicorn's captured signals: it would raise the signal again after
        # the shutdown and the process would die of it instead of exiting 0.
        if self._drain_started is not None or not self.state.ready:
            self.force_exit = self._drain_started is not None
            self.stopped_while_loading = not self.state.ready
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
            if self._aborted:
                logger.info("drained: the requests left at the drain timeout were aborted")
            else:
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
    spawned: list[Any] = []

    def load() -> None:
        try:
            load_engine(args, state, spawned.append)
        except BaseException as exc:  # said in the log and by the exit status
            failure.append(exc)
            if server.stopped_while_loading:
                return  # the engine-core process was stopped on purpose
            state.load_error = f"{type(exc).__name__}: {exc}"
            logger.error("the model failed to load: %s", state.load_error)
            server.should_exit = True

    loader = threading.Thread(target=load, name="turnout-load", daemon=True)
    loader.start()
    server.run()
    if server.stopped_while_loading:
        # Told to stop before the model was in: the engine-core process ignores the signal
        # and would keep the interpreter waiting for it at exit.
        for process in spawned:
            if process.is_alive():
                logger.info("stopping the engine-core process while it loads")
                process.kill()
                process.join(STOP_TIMEOUT_S)
        loader.join(timeout=STOP_TIMEOUT_S)
    else:
        loader.join(timeout=1.0)
    if state.engine is not None:
        state.engine.stop()  # the core stops, leaves the service's targets, shuts down
    if server.stopped_while_loading:
        return EXIT_OK
    return EXIT_LOAD_FAILED if failure else EXIT_OK


__all__ = ["EXIT_LOAD_FAILED", "DrainingServer", "load_engine", "serve"]
