"""Rank 0 of a tensor-parallel engine: :class:`TensorParallelRunner`, the
:class:`~engine.runner_protocol.ModelRunner` the engine drives when ``tensor_parallel_size >
1``.

It spawns ranks ``1 .. N-1`` (``engine.parallel.worker``, one process each, the ``spawn``
start method: CUDA cannot be forked), joins the groups as rank 0 and builds its own runner on
rank 0's shard. Every call that changes a runner's state is broadcast to the workers first, then
made on rank 0's runner: ``load_model``, ``initialize_kv_cache`` and, once per step,
``execute_model`` with the scheduler's output; the KV budget is the smallest rank's. Rank 0
returns its own runner's output: every rank samples the same tokens from the same gathered
logits, so no sampled id travels back.

Failure, never a hang: a watchdog thread polls the workers (their exit, and the error a failing
worker reports over its pipe) every ``WATCHDOG_INTERVAL_S``; a collective with a dead peer
fails at once on gloo, and on NCCL the watchdog aborts the communicator so the host's wait
returns; the data group's ``timeout_s`` bounds anything else. The call that meets the failure
stops every rank and raises :class:`~engine.errors.TensorParallelError` naming the rank and
its cause; any later call raises it again.
"""

from __future__ import annotations

import io
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineError, TensorParallelError, UnsupportedOptionError
from turnout.engine.parallel import group as pg
from turnout.engine.parallel.worker import ERROR, READY, worker_main
from turnout.engine.runner_protocol import ModelRunner
from turnout.engine.sampling_params import SamplingParams

logger = logging.getLogger("turnout.engine")

#: Seconds between two looks of the watchdog at the workers.
WATCHDOG_INTERVAL_S = 0.1
#: Seconds a failed collective waits for the failing worker's report before raising.
FAILURE_GRACE_S = 5.0
#: The environment variable that sets the data group's timeout (seconds).
TIMEOUT_ENV = "TURNOUT_TP_TIMEOUT_S"


def timeout_from_env(environ: dict[str, str] | None = None) -> float:
    """``TURNOUT_TP_TIMEOUT_S`` (default ``engine.parallel.group.DEFAULT_TIMEOUT_S``).

    Raises:
        EngineError: not a number > 0.
    """
    raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV)
    if raw is None:
        return pg.DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise EngineError(f"{TIMEOUT_ENV} must be a number of seconds > 0, got {raw!r}")
    return value


class _Ranks:
    """The worker processes, their pipes and the groups: what a failure or the end tears down
    (held by a finalizer too, so that a dropped engine leaves no process behind)."""

    def __init__(self) -> None:
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Any] = {}
        self.groups: pg.Groups | None = None
        self.failure: TensorParallelError | None = None
        self.closed = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads_before: int | None = None  # rank 0's torch threads before its CPU share

    def poll(self) -> TensorParallelError | None:
        """The first rank seen failing: the error it reported, or how its process ended."""
        with self.lock:
            if self.failure is None and not self.closed:  # after shutdown, exits are the plan
                self.failure = self._find_failure()
            return self.failure

    def _find_failure(self) -> TensorParallelError | None:
        for rank, proc in self.procs.items():
            code = proc.exitcode  # read first: a worker reports its error before it exits
            conn = self.conns[rank]
            while _readable(conn):
                message = _recv(conn)
                if message is None:
                    break
                if message[0] == ERROR:
                    return TensorParallelError(rank, message[2])
            if code is not None:
                return TensorParallelError(rank, _exit_cause(code))
        return None

    def await_failure(self, grace_s: float) -> TensorParallelError | None:
        """A failure seen within ``grace_s`` (a collective failed: its peer is dying)."""
        deadline = time.monotonic() + grace_s
        while (failure := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return failure

    def wait_ready(self, timeout_s: float) -> None:
        waiting, deadline = set(self.conns), time.monotonic() + timeout_s
        while waiting:
            for rank in sorted(waiting):
                conn = self.conns[rank]
                message = _recv(conn) if _readable(conn) else None
                if message is not None and message[0] == READY:
                    waiting.discard(rank)
                elif message is not None and message[0] == ERROR:
                    raise TensorParallelError(rank, message[2])
                elif self.procs[rank].exitcode is not None:
                    raise TensorParallelError(
                        rank,
                        f"{_exit_cause(self.procs[rank].exitcode)} while starting "
                        f"(its stderr says why; a script that builds the engine "
                        f'must do so under `if __name__ == "__main__":`)',
                    )
            if waiting and time.monotonic() > deadline:
                raise TensorParallelError(min(waiting), f"did not start within {timeout_s:g} s")
            time.sleep(0.02)

    def watch(self) -> None:
        # The watchdog: a dead worker is seen between steps and, on NCCL, unblocks a step
        # waiting on it (the communicator is aborted; the step then raises).
        while not self.stop.wait(WATCHDOG_INTERVAL_S):
            if self.poll() is not None:
                pg.abort_data_group()
                return

    def shutdown(self, graceful: bool = True) -> None:
        """Stop every worker and leave the groups (idempotent): the workers are told to exit
        when ``graceful`` and the group is healthy (between steps), else killed."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.stop.set()
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)
        healthy = (
            graceful
            and self.failure is None
            and self.groups is not None
            and all(p.exitcode is None for p in self.procs.values())
        )
        if healthy:
            try:
                pg.broadcast_command(self.groups.control, ("shutdown",))  # type: ignore[union-attr]
            except Exception as exc:
                logger.warning("telling the tensor-parallel workers to stop failed: %s", exc)
                healthy = False
        for proc in self.procs.values():
            proc.join(10.0 if healthy else 0.0)
            if proc.exitcode is None:
                proc.kill()
                proc.join(10.0)
        try:
            pg.destroy_groups()
        except Exception as exc:  # a broken group: nothing left to save
            logger.warning("leaving the tensor-parallel groups failed: %s", exc)
        for conn in self.conns.values():
            conn.close()


class TensorParallelRunner:
    """A :class:`~engine.runner_protocol.ModelRunner` over ``config.tensor_parallel_size``
    ranks: this process is rank 0 and runs ``runner_<runner_name>`` on its shard.

    Args:
        runner_name: ``"v1"`` or ``"v2"``.
        config: the engine's configuration (every rank gets it; rank r's device is ``cuda:r``
            on CUDA).
        timeout_s: how long a collective (and the start-up) may wait (default:
            :func:`timeout_from_env`).
        worker_init: called with its rank in each worker process before anything else (a
            picklable callable: logging set-up, fault injection in tests).

    Raises:
        TensorParallelError: a worker failed to start.
        EngineConfigError: this process already holds a tensor-parallel group.

    Attributes other than the protocol's are rank 0's runner's (``runner``).
    """

    def __init__(
        self,
        runner_name: str,
        config: EngineConfig,
        *,
        timeout_s: float | None = None,
        worker_init: Callable[[int], None] | None = None,
    ) -> None:
        from turnout.engine.runner_loader import create_runner

        size = config.tensor_parallel_size
        timeout_s = timeout_from_env() if timeout_s is None else timeout_s
        pg.check_no_group(size)
        self.config = config
        self._ranks = ranks = _Ranks()
        self._end = weakref.finalize(self, ranks.shutdown)
        # On CPU every rank computes on the same cores: each gets an equal share of the threads.
        threads = (
            None if config.device.startswith("cuda") else max(1, torch.get_num_threads() // size)
        )
        try:
            store = pg.start_store(size, timeout_s)
            self._spawn(runner_name, config, store.port, timeout_s, threads, worker_init)
            if threads is not None:
                ranks.threads_before = torch.get_num_threads()
                torch.set_num_threads(threads)
            ranks.wait_ready(timeout_s)
            ranks.groups = pg.init_groups(store, 0, size, config.device, timeout_s)
            threading.Thread(target=ranks.watch, name="turnout-tp-watchdog", daemon=True).start()
            self.runner: ModelRunner = create_runner(runner_name, config)
        except BaseException:
            ranks.shutdown(graceful=False)
            raise

    def _spawn(
        self,
        runner_name: str,
        config: EngineConfig,
        port: int,
        timeout_s: float,
        threads: int | None,
        worker_init: Callable[[int], None] | None,
    ) -> None:
        ctx = mp.get_context("spawn")
        size = config.tensor_parallel_size
        for rank in range(1, size):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=worker_main,
                name=f"turnout-tp-rank{rank}",
                daemon=True,
                args=(
                    rank,
                    size,
                    port,
                    config,
                    runner_name,
                    send,
                    os.getpid(),
                    timeout_s,
                    threads,
                    worker_init,
                ),
            )
            proc.start()
            send.close()
            self._ranks.procs[rank], self._ranks.conns[rank] = proc, receive

    @property
    def worker_pids(self) -> dict[int, int]:
        """rank -> process id of each worker."""
        return {rank: proc.pid for rank, proc in self._ranks.procs.items()}

    # ---- the protocol --------------------------------------------------------------------
    def load_model(self) -> None:
        self._call("load_model")

    def kv_cache_block_bytes(self) -> int:
        return self.runner.kv_cache_block_bytes()  # every rank holds as many KV heads

    def state_cache_bytes(self) -> int:
        return self.runner.state_cache_bytes()

    def available_kv_cache_bytes(self) -> int:
        result: int = self._call("available_kv_cache_bytes", reduce_min=True)
        return result

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call("initialize_kv_cache", num_blocks)

    def check_sampling_params(self, params: SamplingParams) -> None:
        self.runner.check_sampling_params(params)
        if params.logits_processors:
            flag = f"logits_processors with tensor_parallel_size={self.config.tensor_parallel_size}"
            try:  # they travel to every rank with the scheduler's output, which runs them too
                modules = _pickle_recording_modules(params.logits_processors)
            except Exception as exc:
                raise UnsupportedOptionError(
                    f"{flag} must be picklable (every rank runs them on the same logits): {exc}"
                ) from None
            # Pickled by reference to a module the workers cannot import (a notebook's or
            # `python -c`'s __main__, a module made at run time), they would fail to unpickle
            # the step there and stop every rank: refused here, alone.
            missing = _modules_workers_cannot_import(modules)
            if missing:
                raise UnsupportedOptionError(
                    f"{flag} must be importable by the worker processes (spawned: they import what the "
                    f"pickle names), but they refer to {', '.join(missing)}; define them in a module file"
                ) from None

    def execute_model(self, scheduler_output: Any) -> Any:
        output = self._call("execute_model", scheduler_output)
        return _CheckedOutput(output, self) if hasattr(output, "get_output") else output

    def shutdown(self) -> None:
        """Stop the workers and leave the groups (idempotent); the engine cannot step after."""
        self._end()

    # ---- internals -----------------------------------------------------------------------
    def _call(self, name: str, *args: Any, reduce_min: bool = False) -> Any:
        self.raise_if_failed()
        groups = self._ranks.groups
        assert groups is not None
        try:
            pg.broadcast_command(groups.control, (name, *args))
            result = getattr(self.runner, name)(*args)
            if reduce_min:
                result = pg.min_over_ranks(groups.control, int(result))
        except Exception as exc:
            self._fail(exc)
        except BaseException:  # KeyboardInterrupt mid-step: the ranks are out of step now
            self._ranks.shutdown(graceful=False)
            raise
        self.raise_if_failed()
        return result

    def _fail(self, exc: Exception) -> NoReturn:
        failure = self._ranks.await_failure(FAILURE_GRACE_S)
        self._ranks.shutdown(graceful=False)
        if failure is None:  # rank 0's own error; a timed-out collective names no rank
            if "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
                raise TensorParallelError(None, f"a collective timed out: {exc}") from exc
            raise exc
        raise TensorParallelError(failure.rank, failure.cause) from exc

    def raise_if_failed(self) -> None:
        """Raise the group's failure, if any (and stop every rank).

        Raises:
            TensorParallelError: a rank failed (now or earlier).
            EngineError: the engine was shut down.
        """
        failure = self._ranks.poll()
        if failure is not None:
            self._ranks.shutdown(graceful=False)
            raise TensorParallelError(failure.rank, failure.cause)
        if self._ranks.closed:
            raise EngineError("the tensor-parallel engine was shut down; build a new one")

    def __getattr__(self, name: str) -> Any:
        runner = self.__dict__.get("runner")
        if runner is None:
            raise AttributeError(name)
        return getattr(runner, name)


class _CheckedOutput:
    """Rank 0's asynchronous output, collected only while the group is healthy."""

    def __init__(self, inner: Any, owner: TensorParallelRunner) -> None:
        self._inner, self._owner = inner, owner

    def get_output(self) -> Any:
        try:
            output = self._inner.get_output()
        except Exception as exc:
            self._owner._fail(exc)
        self._owner.raise_if_failed()
        return output


class _ModuleRecorder(pickle.Pickler):
    """A pickler that records the module of every class and function it pickles by reference."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            self.modules.add(getattr(obj, "__module__", None) or "__main__")
        return NotImplemented  # pickled as usual


def _pickle_recording_modules(obj: Any) -> set[str]:
    recorder = _ModuleRecorder(io.BytesIO())
    recorder.dump(obj)
    return recorder.modules


def _modules_workers_cannot_import(modules: set[str]) -> list[str]:
    """Of ``modules``, those a spawned worker cannot import: ``__main__`` when
    ``multiprocessing``'s spawn does not rerun it there (no file, no module spec), and modules
    without a spec (made at run time)."""
    missing = []
    for name in sorted(modules):
        module = sys.modules.get(name)
        if name == "__main__":
            if module is None or (
                getattr(module, "__spec__", None) is None
                and not os.path.isfile(getattr(module, "__file__", None) or "")
            ):
                missing.append("__main__ (an interactive session's)")
        elif module is None or getattr(module, "__spec__", None) is None:
            missing.append(name)
    return missing


def _readable(conn: Any) -> bool:
    try:
        return bool(conn.poll())
    except (OSError, ValueError):
        return False


def _recv(conn: Any) -> tuple[Any, ...] | None:
    try:
        message: tuple[Any, ...] = conn.recv()
        return message
    except (EOFError, OSError):
        return None


def _exit_cause(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"its process was killed by signal {name}"
    return f"its process exited with status {code}"


__all__ = [
    "FAILURE_GRACE_S",
    "TIMEOUT_ENV",
    "WATCHDOG_INTERVAL_S",
    "TensorParallelRunner",
    "timeout_from_env",
]
