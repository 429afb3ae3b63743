"""Where the server's engine core runs: in a process of its own (the default) or in a thread of
the server's process.

A server streams every token of every request through Python: JSON, SSE frames, socket writes.
With the engine stepped by a thread of the same process, that work and the step loop share one
interpreter lock, and at a few hundred streams the HTTP side sets the pace, not the runner.
vLLM runs ``EngineCore`` in a background process for this reason
(``VLLM_ENABLE_V1_MULTIPROCESSING``, default on; vllm/v1/engine/core_client.py ``MPClient``);
turnout does the same: :class:`ProcessCore` spawns the engine-core process, which builds the
``LLM`` (the runner decision, the model, the KV cache, the registration with the service),
steps it with :class:`~turnout.serving.core_loop.CoreLoop` and sends one
:class:`~turnout.serving.core_loop.StepUpdate` per step over a pipe.
``TURNOUT_ENABLE_MULTIPROCESSING=0`` keeps it in a thread instead (:class:`InprocCore`): one
process, the same loop, the same updates.

The engine-core process ignores SIGINT and SIGTERM: the server's process drains on them and
then stops the core itself. It exits when told to stop or when its pipe from the server
closes (the server died, even by ``kill -9``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, Protocol

from turnout.serving.args import ServeArgs
from turnout.serving.core_loop import Command, CoreLoop, StepUpdate
from turnout.serving.startup import (
    EngineInfo,
    build_llm,
    engine_info,
    freeze_heap,
    register,
    unregister_and_shutdown,
)

logger = logging.getLogger("turnout.serving")

#: The environment variable that chooses where the core runs (vLLM's
#: ``VLLM_ENABLE_V1_MULTIPROCESSING``): ``0``, false, no or off keep it in a thread.
MULTIPROCESSING_ENV = "TURNOUT_ENABLE_MULTIPROCESSING"
#: Seconds an idle loop waits for a command before it looks at its stop flag again.
IDLE_POLL_S = 0.5
#: Seconds the engine-core process gets to stop before it is killed.
STOP_TIMEOUT_S = 10.0
_OFF = frozenset({"0", "false", "no", "off"})

OnUpdate = Callable[[StepUpdate], None]
OnFailure = Callable[[str], None]


class EngineLoadError(RuntimeError):
    """The engine could not be built (the engine-core process's message), or that process
    died while loading."""


class CoreClient(Protocol):
    """The front end's handle on the engine core."""

    info: EngineInfo

    def start(self, on_update: OnUpdate, on_failure: OnFailure) -> None:
        """Start stepping; each iteration's update goes to ``on_update`` (on a thread of the
        client's, never the event loop); ``on_failure`` hears once why the core is gone."""

    def send(self, command: Command) -> None:
        """Queue a command for the loop (thread-safe)."""

    def stop(self) -> None:
        """Stop the loop (what is left is aborted), unregister and shut the engine down."""


def multiprocessing_enabled(environ: dict[str, str] | None = None) -> bool:
    """``TURNOUT_ENABLE_MULTIPROCESSING`` (default on)."""
    env = os.environ if environ is None else environ
    return env.get(MULTIPROCESSING_ENV, "1").strip().lower() not in _OFF


def load_core(args: ServeArgs, on_spawn: Callable[[Any], None] | None = None) -> CoreClient:
    """Build the engine where ``TURNOUT_ENABLE_MULTIPROCESSING`` says; ``on_spawn`` gets the
    engine-core process as soon as it is started (the server kills it if it is told to stop
    while the model loads).

    Raises:
        EngineLoadError: the engine-core process failed to build it (its message).
        EngineConfigError, FileNotFoundError, ModelConfigError: the same, in this process.
    """
    if multiprocessing_enabled():
        return ProcessCore.load(args, on_spawn)
    return InprocCore.load(args)


class InprocCore:
    """The core stepped by a thread of this process."""

    def __init__(self, llm: Any, info: EngineInfo) -> None:
        self.llm = llm
        self.info = info
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.loop = CoreLoop(llm.core, llm.health_recorder)

    @classmethod
    def load(cls, args: ServeArgs) -> InprocCore:
        logger.info("engine core: stepped by a thread of this process (%s=0)", MULTIPROCESSING_ENV)
        llm = build_llm(args)
        try:
            engine_id = register(args, llm)
        except BaseException:
            llm.shutdown()
            raise
        freeze_heap("server and engine core")
        return cls(llm, engine_info(llm, args, engine_id))

    def start(self, on_update: OnUpdate, on_failure: OnFailure) -> None:
        def run() -> None:
            try:
                self.loop.run(self._take, on_update)
            except BaseException as exc:  # said to every stream, never swallowed
                logger.exception("the engine loop stopped")
                on_failure(f"the engine loop stopped: {type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=run, name="turnout-engine", daemon=True)
        self._thread.start()

    def _take(self, block: bool) -> list[Command] | None:
        commands: list[Command] = []
        if block and not self._stopping.is_set():
            with contextlib.suppress(queue.Empty):
                commands.append(self._inbox.get(timeout=IDLE_POLL_S))
        if self._stopping.is_set():
            return None
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def send(self, command: Command) -> None:
        self._inbox.put(command)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        unregister_and_shutdown(self.llm, self.info.engine_id)


class ProcessCore:
    """The core in the engine-core process; commands and updates cross two pipes."""

    def __init__(
        self, process: Any, commands: Connection, updates: Connection, info: EngineInfo
    ) -> None:
        self.process = process
        self.info = info
        self._commands = commands
        self._updates = updates
        # Commands go through a queue and a sender thread of their own: a pipe write blocks
        # when the core is busy with a long step and the pipe is full, and neither the event
        # loop nor the receiver (the only reader of the updates) may wait on that.
        self._outbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._receiver: threading.Thread | None = None
        self._sender = threading.Thread(
            target=self._send_all, name="turnout-engine-in", daemon=True
        )
        self._sender.start()

    @classmethod
    def load(cls, args: ServeArgs, on_spawn: Callable[[Any], None] | None = None) -> ProcessCore:
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        commands_r, commands_w = ctx.Pipe(duplex=False)
        updates_r, updates_w = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=core_process_main,
            args=(args, commands_r, updates_w, logging.getLogger().getEffectiveLevel()),
            name="turnout-engine-core",
        )
        process.start()
        if on_spawn is not None:
            on_spawn(process)
        commands_r.close()
        updates_w.close()
        logger.info("engine core: process %d is loading the model", process.pid)
        try:
            kind, payload = updates_r.recv()
        except (EOFError, OSError):
            process.join(STOP_TIMEOUT_S)
            raise EngineLoadError(
                f"the engine-core process exited while loading (exit code {process.exitcode})"
            ) from None
        if kind != "ready":
            process.join(STOP_TIMEOUT_S)
            raise EngineLoadError(str(payload))
        assert isinstance(payload, EngineInfo)
        return cls(process, commands_w, updates_r, payload)

    def start(self, on_update: OnUpdate, on_failure: OnFailure) -> None:
        def receive() -> None:
            while True:
                try:
                    update = self._updates.recv()
                except (EOFError, OSError):
                    if not self._stopping.is_set():
                        self.process.join(1.0)
                        on_failure(
                            f"the engine-core process exited (exit code {self.process.exitcode})"
                        )
                    return
                try:
                    on_update(update)
                except Exception:  # a front-end bug must not stop every other stream
                    logger.exception("an engine update could not be delivered")

        self._receiver = threading.Thread(target=receive, name="turnout-engine-out", daemon=True)
        self._receiver.start()

    def send(self, command: Command) -> None:
        self._outbox.put(command)  # never blocks

    def _send_all(self) -> None:
        while True:
            command = self._outbox.get()
            try:
                self._commands.send(command)
            except OSError:  # the process is gone: the receiver says so to every stream
                logger.debug("command %r not sent: the engine core is gone", command)
            if command is None:
                return

    def stop(self) -> None:
        self._stopping.set()
        self._outbox.put(None)  # after every command queued before it
        self._sender.join(STOP_TIMEOUT_S)
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            logger.warning("the engine-core process did not stop in %g s: killed", STOP_TIMEOUT_S)
            self.process.kill()
            self.process.join(STOP_TIMEOUT_S)
        self._commands.close()
        if self._receiver is not None:
            self._receiver.join(STOP_TIMEOUT_S)
        self._updates.close()


def core_process_main(
    args: ServeArgs, commands: Connection, updates: Connection, log_level: int
) -> None:
    """The engine-core process: build the engine, say ``ready`` (or the error), step until told
    to stop or until the server's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s (engine core): %(message)s")
    try:
        llm = build_llm(args)
        engine_id = register(args, llm)
    except BaseException as exc:  # the server reports it and exits with its status
        updates.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    try:
        freeze_heap("engine core")
        updates.send(("ready", engine_info(llm, args, engine_id)))
        CoreLoop(llm.core, llm.health_recorder).run(
            lambda block: _take(commands, block), lambda u: updates.send(u)
        )
    except (BrokenPipeError, ConnectionResetError):
        logger.info("the server went away: stopping")
    finally:
        unregister_and_shutdown(llm, engine_id)


def _take(commands: Connection, block: bool) -> Sequence[Command] | None:
    taken: list[Command] = []
    try:
        if block and not commands.poll(IDLE_POLL_S):
            return taken
        while commands.poll(0):
            command = commands.recv()
            if command is None:
                return None
            taken.append(command)
    except (EOFError, OSError):  # the server is gone
        return None
    return taken


__all__ = [
    "MULTIPROCESSING_ENV",
    "STOP_TIMEOUT_S",
    "CoreClient",
    "EngineLoadError",
    "InprocCore",
    "ProcessCore",
    "core_process_main",
    "load_core",
    "multiprocessing_enabled",
]
