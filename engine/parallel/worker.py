"""Ranks ``1 .. N-1`` of a tensor-parallel engine: each runs the runner rank 0 runs, on its
shard, in lockstep with it.

:func:`worker_main` is the entry point of a spawned worker process: it joins the groups, builds
the runner (the same ``runner_<name>.create_model_runner(config)`` as rank 0; the runner shards
its model by its rank, ``engine.parallel.group.current_tensor_parallel``), then executes every
command rank 0 broadcasts: ``load_model``, ``available_kv_cache_bytes`` (reduced to the
smallest), ``initialize_kv_cache``, ``execute_model`` with the step's scheduler output, and
``shutdown``. A worker returns nothing: every rank gathers the full logits and samples the same
tokens from them (seeded noise; ``docs/tensor-parallel.md``), so its request table advances as
rank 0's does without a broadcast back.

A worker that fails sends its exception's text to rank 0 over its pipe and exits: rank 0's
next collective with it fails at once (gloo: the connection closes), and rank 0 raises
:class:`~engine.errors.TensorParallelError` naming the rank and the cause. A worker whose
parent is gone (the engine killed) exits by itself.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

#: What a worker sends rank 0 over its pipe: ("ready", rank) once connected to the store with
#: its device selected (just before it joins the groups), ("error", rank, text) before it exits
#: on an exception.
READY, ERROR = "ready", "error"


def worker_main(
    rank: int,
    size: int,
    port: int,
    config: Any,
    runner_name: str,
    conn: Any,
    parent_pid: int,
    timeout_s: float,
    num_threads: int | None,
    worker_init: Callable[[int], None] | None = None,
) -> None:
    """Run rank ``rank`` until rank 0 says ``shutdown`` (or fails); never returns normally: the
    process leaves through ``os._exit`` (no interpreter teardown racing the groups' threads)."""
    _watch_parent(parent_pid)
    code = 0
    try:
        import torch

        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if worker_init is not None:
            worker_init(rank)
        _serve(rank, size, port, config, runner_name, timeout_s, conn)
    except BaseException as exc:  # reported, then the process ends: rank 0 raises
        code = 1
        with contextlib.suppress(OSError):
            conn.send((ERROR, rank, _describe(exc)))
    finally:
        try:
            from turnout.engine.parallel.group import destroy_groups

            destroy_groups()
        except Exception:
            code = code or 1
        os._exit(code)


def _serve(
    rank: int, size: int, port: int, config: Any, runner_name: str, timeout_s: float, conn: Any
) -> None:
    from turnout.engine.parallel.group import (
        connect_store,
        init_groups,
        min_over_ranks,
        prepare_device,
        receive_command,
    )
    from turnout.engine.runner_loader import create_runner

    store = connect_store(port, size, timeout_s)
    prepare_device(rank, config.device)
    # Ready only now: rank 0 watches the workers until every one is ready, then waits in the
    # rendezvous, where a worker failing would leave it waiting for the whole timeout.
    conn.send((READY, rank))
    groups = init_groups(store, rank, size, config.device, timeout_s)
    # rank 0's config: the runner picks its own GPU (cuda:rank) from its rank
    runner = create_runner(runner_name, config)
    pending: Any = None  # the last step's output handle, kept until the next step is launched
    while True:
        name, *args = receive_command(groups.control)
        if name == "shutdown":
            return
        result = getattr(runner, name)(*args)
        if name == "available_kv_cache_bytes":
            min_over_ranks(groups.control, int(result))
        elif name == "execute_model":
            # Dropping a handle only releases its buffers (the host copies of runner_v2's
            # async output are stream-ordered); nothing here waits for the device.
            pending = result  # noqa: F841 - held until the next step's handle replaces it
        del result


def _watch_parent(parent_pid: int) -> None:
    # A SIGKILLed engine closes no pipe a blocked collective would notice soon; the worker is
    # re-parented, and this thread ends it.
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="turnout-tp-parent-watch", daemon=True).start()


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


__all__ = ["ERROR", "READY", "worker_main"]
