"""Typed errors of the engine core, each with a stable ``code`` (CONVENTIONS: lower layers raise
typed domain errors; the CLI and the facade turn them into messages)."""

from __future__ import annotations


class EngineError(Exception):
    """Base of the engine's errors; ``code`` is stable across releases."""

    code = "engine_error"


class InvalidRequestError(EngineError, ValueError):
    """A request (prompt or sampling parameters) the engine cannot serve.

    Raised at :meth:`engine.core.EngineCore.add_request` time, before the request takes any
    resource: the request is rejected alone and the rest of the batch carries on.
    """

    code = "invalid_request"


class UnsupportedOptionError(InvalidRequestError):
    """An option the chosen runner does not implement (never silently ignored)."""

    code = "unsupported_option"


class EngineConfigError(EngineError, ValueError):
    """An engine argument that cannot be honoured (bad value, or a runner pin the oracle
    refuses)."""

    code = "invalid_engine_config"


class NoRunnerError(EngineConfigError):
    """The oracle found no runner for the deployment (e.g. a V2 pin with a hard blocker)."""

    code = "no_runner"


class TensorParallelError(EngineError):
    """A rank of a tensor-parallel group failed (its process died, or raised): the group cannot
    go on, so the engine stops every rank and raises this instead of waiting on a collective
    that would never complete. Build a new engine to continue.

    Attributes:
        rank: the rank that failed (``None``: unknown, e.g. a collective timed out).
        cause: what happened to it (``killed by signal SIGKILL``, ``exited with status 1``, or
            the exception it raised).
    """

    code = "tensor_parallel_rank_failed"

    def __init__(self, rank: int | None, cause: str) -> None:
        self.rank = rank
        self.cause = cause
        who = f"rank {rank}" if rank is not None else "a rank"
        super().__init__(f"tensor-parallel {who} failed: {cause}; every rank was stopped")


__all__ = [
    "EngineConfigError",
    "EngineError",
    "InvalidRequestError",
    "NoRunnerError",
    "TensorParallelError",
    "UnsupportedOptionError",
]
