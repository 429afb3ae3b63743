"""The engine side of the server: one ``EngineCore`` stepped in a loop, commands in, one
:class:`StepUpdate` out per step.

The loop is the same whether it runs in a thread of the server's process or in a process of
its own (:mod:`~turnout.serving.core_client`): it takes the commands waiting (``add``,
``abort``, ``abort_all``), steps the core when anything is unfinished, and emits what the step
changed as plain, picklable records: each request's new token ids and logprobs, its first
scheduling (with its prefix-cache hits), new preemptions, its finish. Text, stop strings,
metrics and the clients' queues are the front end's (:mod:`~turnout.serving.async_engine`).
vLLM splits its server the same way: ``EngineCore`` in a process that only schedules and
executes, ``EngineCoreOutputs`` over ZMQ, detokenization in the API server's
``OutputProcessor`` (vllm/v1/engine/core.py, vllm/v1/engine/output_processor.py).

The health recorder reported to the rollout-control service lives here, beside the core: it
sees each request queued, its progress and its finish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnout.engine.errors import InvalidRequestError
from turnout.engine.outputs import Logprobs
from turnout.engine.pooling_params import PoolingParams
from turnout.engine.request import Request, RequestStatus
from turnout.engine.sampling_params import SamplingParams

logger = logging.getLogger("turnout.serving")


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request (its id is the front end's)."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | None = None
    pooling: PoolingParams | None = None


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Abort one request (a client gone, a stop string matched); its KV blocks are freed."""

    req_id: str


@dataclass(frozen=True, slots=True)
class AbortAll:
    """Abort every request (the drain ran out of time)."""


Command = AddRequest | AbortRequest | AbortAll


@dataclass(slots=True)
class RequestUpdate:
    """What one step changed for one request.

    Attributes:
        req_id: the request.
        new_token_ids: output token ids since the last update.
        new_logprobs: their logprobs chunks (empty unless asked for).
        num_prompt_tokens: the prompt's length.
        num_cached_tokens: prompt tokens found in the prefix cache; ``-1`` until the request
            is first scheduled (then set once, with ``first_scheduled``).
        first_scheduled: the request got its first tokens computed in this step.
        num_new_preemptions: preemptions since the last update.
        finish_reason: ``stop``, ``length``, ``abort`` or ``error`` when it finished.
        stop_reason: the stop token id that finished it, else ``None``.
        error: why the engine failed it (``finish_reason="error"``).
        pooled: a pooling request's output (embeddings), with its finish.
    """

    req_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[Logprobs] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = -1
    first_scheduled: bool = False
    num_new_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None
    pooled: list[float] | None = None


@dataclass(slots=True)
class StepUpdate:
    """One loop iteration's news: admissions first, then the step's request updates and the
    scheduler's gauges after it.

    Attributes:
        admissions: ``(req_id, refusal)`` for each request added in this iteration;
            ``refusal`` is ``None`` when the scheduler took it, else the engine's message.
        requests: the step's :class:`RequestUpdate` records.
        num_running / num_waiting: the scheduler's queues after the step.
        kv_cache_usage: the fraction of KV blocks in use, ``[0, 1]``.
        num_iteration_tokens: tokens the step computed (prefill and decode), 0 when no step.
        stepped: a step ran in this iteration.
    """

    admissions: list[tuple[str, str | None]] = field(default_factory=list)
    requests: list[RequestUpdate] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_iteration_tokens: int = 0
    stepped: bool = False


@dataclass(slots=True)
class _Live:
    request: Request
    num_sent_ids: int = 0
    num_sent_lp_chunks: int = 0
    num_seen_preemptions: int = 0
    num_seen_computed: int = 0
    scheduled: bool = False


class CoreLoop:
    """Steps one engine core for the server.

    Args:
        core: the :class:`~turnout.engine.core.EngineCore`; only this loop touches it.
        recorder: the health recorder reported to the service (``LLM.health_recorder``),
            or ``None``.
    """

    def __init__(self, core: Any, recorder: Any = None) -> None:
        self.core = core
        self.recorder = recorder
        self._live: dict[str, _Live] = {}
        self.num_steps = 0

    def run(
        self,
        take: Callable[[bool], Sequence[Command] | None],
        emit: Callable[[StepUpdate], None],
    ) -> None:
        """Loop until ``take`` returns ``None`` (stop), then abort what is left.

        Args:
            take: the commands waiting; with ``True`` it may wait a while for one (the engine
                is idle). ``None`` stops the loop.
            emit: receives each iteration's :class:`StepUpdate` (not called when nothing
                happened).
        """
        try:
            while True:
                commands = take(not self.core.has_unfinished_requests())
                if commands is None:
                    return
                update = self.iterate(commands)
                if update is not None:
                    emit(update)
        finally:
            self._abort_everything()

    def iterate(self, commands: Sequence[Command]) -> StepUpdate | None:
        """Apply the commands, step once when anything is unfinished: the update, or ``None``
        when nothing happened."""
        update = StepUpdate()
        for command in commands:
            if isinstance(command, AddRequest):
                update.admissions.append((command.req_id, self._add(command)))
            elif isinstance(command, AbortRequest):
                self._abort(command.req_id, update)
            else:
                for req_id in list(self._live):
                    self._abort(req_id, update)
        if self.core.has_unfinished_requests():
            update.stepped = True
            try:
                self.core.step()
                self.num_steps += 1
            except Exception as exc:  # a runner bug: fail what is running, keep serving
                logger.exception("a step failed; its requests are aborted")
                self.core.abort_all()
                self._fail_all(f"the engine failed: {type(exc).__name__}: {exc}", update)
            else:
                self._collect(update)
        elif not commands:
            return None
        scheduler = self.core.scheduler
        update.num_running = len(scheduler.running)
        update.num_waiting = len(scheduler.waiting)
        update.kv_cache_usage = float(scheduler.kv_cache_manager.usage)
        return update

    # -- commands ---------------------------------------------------------------------------
    def _add(self, command: AddRequest) -> str | None:
        try:
            if command.pooling is not None:
                request = self.core.add_request(
                    command.req_id, command.prompt_token_ids, pooling_params=command.pooling
                )
            else:
                request = self.core.add_request(
                    command.req_id, command.prompt_token_ids, command.params
                )
        except InvalidRequestError as exc:
            return str(exc)
        except Exception as exc:  # never lose the request silently
            logger.exception("request %s could not be added", command.req_id)
            return f"the engine refused the request: {exc}"
        self._live[command.req_id] = _Live(request)
        if self.recorder is not None:
            self.recorder.queued(command.req_id)
        return None

    def _abort(self, req_id: str, update: StepUpdate) -> None:
        live = self._live.get(req_id)
        if live is None:
            return
        self.core.abort_request(req_id)
        self._retire(live, update, "abort")

    def _fail_all(self, error: str, update: StepUpdate) -> None:
        for live in list(self._live.values()):
            self._retire(live, update, "error", error=error)

    def _abort_everything(self) -> None:
        for req_id in list(self._live):
            try:
                self.core.abort_request(req_id)
            except Exception:  # shutting down: nothing more to tell anyone
                logger.debug("abort of %s at shutdown failed", req_id, exc_info=True)
            if self.recorder is not None:
                self.recorder.finished(req_id, failed=False)
        self._live.clear()

    # -- after a step -----------------------------------------------------------------------
    def _collect(self, update: StepUpdate) -> None:
        progress: list[tuple[str, int]] = []
        for live in list(self._live.values()):
            req = live.request
            record = self._changes(live, update)
            if req.pooling:
                if req.is_finished:
                    reason = req.status.finish_reason or "abort"
                    self._retire(live, update, reason, record=record, error=req.error)
                    record.pooled = req.pooled_output
                elif record.first_scheduled or record.num_new_preemptions:
                    update.requests.append(record)
                continue
            new_ids = req.output_token_ids[live.num_sent_ids :]
            if new_ids:
                live.num_sent_ids += len(new_ids)
                record.new_token_ids = list(new_ids)
                progress.append((req.req_id, live.num_sent_ids))
            params = req.sampling_params
            if params is not None and params.logprobs is not None and new_ids:
                record.new_logprobs = list(req.logprobs[live.num_sent_lp_chunks :])
                live.num_sent_lp_chunks = len(req.logprobs)
            if req.is_finished:
                error = req.error if req.status is RequestStatus.FINISHED_ERROR else None
                reason = req.status.finish_reason or "abort"
                record.stop_reason = req.stop_reason
                self._retire(live, update, reason, record=record, error=error)
            elif new_ids or record.first_scheduled or record.num_new_preemptions:
                update.requests.append(record)
        if self.recorder is not None and progress:
            self.recorder.observe(progress)

    def _changes(self, live: _Live, update: StepUpdate) -> RequestUpdate:
        req = live.request
        record = RequestUpdate(req.req_id, num_prompt_tokens=req.num_prompt_tokens)
        computed = req.num_computed_tokens
        if computed > live.num_seen_computed:
            update.num_iteration_tokens += computed - live.num_seen_computed
        live.num_seen_computed = computed
        if not live.scheduled and (computed > 0 or req.is_finished):
            live.scheduled = True
            record.first_scheduled = True
            record.num_cached_tokens = max(0, req.num_cached_tokens)
        if req.num_preemptions > live.num_seen_preemptions:
            record.num_new_preemptions = req.num_preemptions - live.num_seen_preemptions
            live.num_seen_preemptions = req.num_preemptions
        return record

    def _retire(
        self,
        live: _Live,
        update: StepUpdate,
        reason: str,
        *,
        record: RequestUpdate | None = None,
        error: str | None = None,
    ) -> None:
        req = live.request
        if record is None:
            record = RequestUpdate(req.req_id, num_prompt_tokens=req.num_prompt_tokens)
        record.finish_reason = reason
        record.error = error
        self._live.pop(req.req_id, None)
        if self.recorder is not None:
            self.recorder.finished(req.req_id, failed=reason == "error")
        update.requests.append(record)


__all__ = [
    "AbortAll",
    "AbortRequest",
    "AddRequest",
    "Command",
    "CoreLoop",
    "RequestUpdate",
    "StepUpdate",
]
