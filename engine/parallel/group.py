"""The process groups of a tensor-parallel engine, and the commands rank 0 sends over them.

Rendezvous: rank 0 starts a ``torch.distributed.TCPStore`` on 127.0.0.1 on a port the kernel
picks (no race for a "free" port), and hands the port to the workers it spawns. Two groups:

- the *data* group (the default group): the model's collectives, gloo on CPU and NCCL on CUDA,
  with ``timeout_s`` (a collective that waits longer fails instead of hanging);
- the *control* group, always gloo on the host: rank 0 broadcasts each command (the
  scheduler's output once per step, pickled by ``broadcast_object_list``) and reduces the few
  numbers the ranks must agree on. Its timeout is long, since a worker waits there while the
  engine has no work; a worker whose engine is gone learns it from the closed connection (and
  from its parent-watch thread, ``engine.parallel.worker``).

One tensor-parallel engine per process: ``torch.distributed`` has one default group.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from turnout.engine.errors import EngineConfigError
from turnout.engine.model.parallel_layers import TensorParallel

logger = logging.getLogger("turnout.engine")

#: Seconds a collective of the data group (and the start-up rendezvous) may wait.
DEFAULT_TIMEOUT_S = 300.0
#: The control group waits for the next command while the engine is idle: a long timeout.
CONTROL_TIMEOUT = timedelta(days=7)


def backend_for(device: str) -> str:
    """``"nccl"`` for a CUDA device, else ``"gloo"``."""
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(device: str, rank: int) -> str:
    """The device rank ``rank`` runs on: ``cuda:{rank}`` for CUDA, else ``device``."""
    return f"cuda:{rank}" if device.startswith("cuda") else device


def start_store(size: int, timeout_s: float) -> Any:  # -> dist.TCPStore
    """Rank 0's store, listening on 127.0.0.1 on a port of the kernel's choice (``.port``)."""
    return dist.TCPStore(  # type: ignore[attr-defined]  # torch.distributed re-exports it implicitly
        "127.0.0.1",
        0,
        size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def connect_store(port: int, size: int, timeout_s: float) -> Any:  # -> dist.TCPStore
    """A worker's client of rank 0's store."""
    return dist.TCPStore(  # type: ignore[attr-defined]  # torch.distributed re-exports it implicitly
        "127.0.0.1", port, size, is_master=False, timeout=timedelta(seconds=timeout_s)
    )


@dataclass
class Groups:
    """This process's groups: ``tp`` (its rank, for the model layer), ``control`` (the gloo
    group of the commands) and the data group's ``backend``."""

    tp: TensorParallel
    control: Any
    backend: str


def check_no_group(size: int) -> None:
    """Raises EngineConfigError when this process already holds a process group (another
    tensor-parallel engine lives in it)."""
    if dist.is_initialized():
        raise EngineConfigError(
            f"tensor_parallel_size={size}: this process already holds a torch.distributed group (another "
            "tensor-parallel engine runs in it); shut that engine down first (LLM.shutdown())"
        )


def prepare_device(rank: int, device: str) -> str:
    """Select rank ``rank``'s GPU (CUDA) before it joins the groups; returns the data group's
    backend. A worker calls it before it reports ready: what can fail here is then reported
    while rank 0 still watches the workers, not while it waits in the rendezvous."""
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        # On an error or a timeout, NCCL's watchdog aborts the communicator without killing the
        # process (torch's default tears it down): rank 0 is the user's process, which raises
        # TensorParallelError instead. Read when the group is made.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    return backend


def init_groups(store: Any, rank: int, size: int, device: str, timeout_s: float) -> Groups:
    """Join the data group and the control group as ``rank`` of ``size`` (every rank calls it).

    Raises:
        EngineConfigError: this process already holds a process group.
    """
    check_no_group(size)
    backend = prepare_device(rank, device)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
    )
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Groups(TensorParallel(rank, size), control, backend)


def current_tensor_parallel(size: int) -> TensorParallel | None:
    """This process's place in the group of a runner at ``tensor_parallel_size=size`` (None
    for 1): what ``RunnerBase`` shards its model by.

    Raises:
        EngineConfigError: no group of that size (the runner was built outside the engine's
            wiring, which starts one process per rank: ``engine.runner_loader``).
    """
    if size == 1:
        return None
    if not dist.is_initialized() or dist.get_world_size() != size:
        raise EngineConfigError(
            f"tensor_parallel_size={size}: a runner of one rank needs the group of all {size}; build "
            "the engine with engine.runner_loader.build_engine_core (or LLM), which starts them"
        )
    return TensorParallel(dist.get_rank(), size)


def broadcast_command(control: Any, command: tuple[Any, ...]) -> None:
    """Rank 0: send ``command`` (``(method name, *args)``) to every worker."""
    dist.broadcast_object_list([command], src=0, group=control)


def receive_command(control: Any) -> tuple[Any, ...]:
    """A worker: the next command of rank 0 (waits for it)."""
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, group=control)
    command: tuple[Any, ...] = box[0]
    return command


def min_over_ranks(control: Any, value: int) -> int:
    """The smallest of every rank's ``value`` (the KV budget the ranks share)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=control)
    return int(t.item())


def abort_data_group() -> None:
    """Abort the data group's pending collectives (NCCL: kernels waiting on a dead peer spin on
    the GPU; aborting the communicator lets the host's wait return). Best effort: gloo needs
    none (a dead peer's closed sockets fail its collectives at once)."""
    if not dist.is_initialized() or dist.get_backend() != "nccl":
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
    except Exception as exc:  # the engine raises TensorParallelError either way
        logger.warning("aborting the NCCL group failed: %s", exc)


def destroy_groups() -> None:
    """Leave every group of this process (idempotent)."""
    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = [
    "CONTROL_TIMEOUT",
    "DEFAULT_TIMEOUT_S",
    "Groups",
    "abort_data_group",
    "backend_for",
    "broadcast_command",
    "check_no_group",
    "connect_store",
    "current_tensor_parallel",
    "destroy_groups",
    "init_groups",
    "min_over_ranks",
    "prepare_device",
    "rank_device",
    "receive_command",
    "start_store",
]
