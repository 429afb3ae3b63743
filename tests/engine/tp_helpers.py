"""Test helpers of tensor parallelism that run inside the spawned worker processes (so they
live in an importable module, by name): fault injection through ``worker_init``."""

from __future__ import annotations

from typing import Any

FAULT = "injected fault"


def fail_third_step_on_rank_1(rank: int) -> None:
    """``worker_init``: rank 1's runner raises on its third ``execute_model``."""
    if rank != 1:
        return
    import turnout.runner_v1.model_runner as v1

    original = v1.V1ModelRunner.execute_model
    calls = [0]

    def execute_model(self: Any, scheduler_output: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError(f"{FAULT} on rank {rank}")
        return original(self, scheduler_output)

    v1.V1ModelRunner.execute_model = execute_model  # type: ignore[method-assign]


def fail_joining_on_rank_1(rank: int) -> None:
    """``worker_init``: rank 1 fails after its start-up report, before it joins the groups
    (where a GPU that cannot be selected, or a store that cannot be reached, fails)."""
    if rank != 1:
        return
    import turnout.engine.parallel.group as group

    def connect_store(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"{FAULT} on rank {rank}")

    group.connect_store = connect_store
