"""The server's front end of the engine: the HTTP event loop's side of one ``EngineCore``.

Continuous batching: every request of every client is added to the same scheduler, which
packs them into each step (``max_num_seqs``, ``max_num_batched_tokens``); a request that
arrives mid-generation joins the next step. The event loop never waits on a step: it sends
commands (add, abort) to the core (:mod:`~turnout.serving.core_client`: a process of its own
by default, else a thread) and awaits the request's own ``asyncio.Queue``. Each step comes back
as one :class:`~turnout.serving.core_loop.StepUpdate`; a thread of the client's turns it into
one :class:`Delta` per live request (new token ids, their text from the incremental
detokenizer, their logprobs, the finish), counts the metrics, and hands the whole step's
batch to the loop in one ``call_soon_threadsafe``. A stream that fell behind takes every delta
waiting in its queue as one chunk (vLLM's ``RequestOutputCollector`` merges the same way,
vllm/v1/engine/output_processor.py), so a busy event loop writes fewer, larger chunks instead
of falling further behind.

Stop strings are matched here: a match ends the stream at once (``finish_reason="stop"``, as
vLLM reports it) and aborts the request in the scheduler, which frees its KV blocks; tokens
the core made for it meanwhile are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnout.engine.errors import InvalidRequestError
from turnout.engine.outputs import Logprobs
from turnout.engine.pooling_params import PoolingParams
from turnout.engine.sampling_params import SamplingParams
from turnout.serving.core_client import CoreClient
from turnout.serving.core_loop import AbortAll, AbortRequest, AddRequest, RequestUpdate, StepUpdate
from turnout.serving.detokenize import IncrementalDetokenizer
from turnout.serving.metrics import RequestTimes, ServingMetrics

logger = logging.getLogger("turnout.serving")


class EngineDeadError(RuntimeError):
    """The engine core is gone (its process died, or its loop stopped): nothing more can be
    served; ``/health`` says 503."""


@dataclass
class Delta:
    """What one step added to one request (one choice).

    Attributes:
        token_ids: new output token ids.
        text: new text (held back near a possible stop string while streaming).
        logprobs: the new tokens' logprobs (``None`` unless asked for).
        finish_reason: ``stop``, ``length``, ``abort`` or ``error`` on the last delta.
        stop_reason: the stop string or stop token id that finished it, else ``None``.
        num_prompt_tokens / num_output_tokens: counts so far (for ``usage``).
        pooled: the pooling output (embeddings), on the last delta of a pooling request.
        error: why the engine failed the request (``finish_reason="error"``).
    """

    token_ids: list[int]
    text: str
    logprobs: Logprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    pooled: list[float] | None = None
    error: str | None = None

    def merge(self, later: Delta) -> Delta:
        """This delta and the ``later`` one of the same request as one (a stream that fell
        behind sends them together); counts, finish and pooling output are the later's."""
        logprobs = self.logprobs
        if later.logprobs is not None:
            logprobs = (
                later.logprobs
                if logprobs is None
                else Logprobs.concat([logprobs, later.logprobs], logprobs.num_logprobs)
            )
        return Delta(
            self.token_ids + later.token_ids,
            self.text + later.text,
            logprobs,
            finish_reason=later.finish_reason,
            stop_reason=later.stop_reason,
            num_prompt_tokens=later.num_prompt_tokens,
            num_output_tokens=later.num_output_tokens,
            num_cached_tokens=later.num_cached_tokens,
            pooled=later.pooled,
            error=later.error,
        )


@dataclass(eq=False)
class _Stream:
    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | None
    pooling: PoolingParams | None
    detokenizer: IncrementalDetokenizer | None
    times: RequestTimes
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Delta | BaseException] = field(default_factory=asyncio.Queue)
    admitted: asyncio.Future[None] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    done: bool = False


class AsyncEngine:
    """One engine core behind an asyncio interface.

    Args:
        core: the :class:`~turnout.serving.core_client.CoreClient` (loaded, not started).
        tokenizer: for text (``None``: token ids only).
        metrics: the server's :class:`ServingMetrics`.
        max_num_queued_reqs: waiting requests at most before :meth:`would_exceed_queue_bound`
            says so (``None``: no bound).
    """

    def __init__(
        self,
        core: CoreClient,
        tokenizer: Any,
        metrics: ServingMetrics,
        *,
        max_num_queued_reqs: int | None = None,
    ) -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.max_num_queued_reqs = max_num_queued_reqs
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._num_pending = 0  # adds sent, not yet answered by the core
        self._num_waiting = 0  # the scheduler's waiting queue after the last step
        self.num_steps = 0
        self.failed: str | None = None

    # -- the event loop's side ----------------------------------------------------------------
    def start(self) -> None:
        self.core.start(self._apply, self._core_failed)

    def stop(self) -> None:
        """Stop the core (unfinished requests are aborted) and shut the engine down."""
        self.core.stop()
        out: list[tuple[_Stream, Delta | BaseException]] = []
        for stream in list(self._streams.values()):
            out.append((stream, RuntimeError("the server is shutting down")))
        self._streams.clear()
        _publish(out)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for a first step: the scheduler's queue plus adds not applied."""
        with self._lock:
            return self._num_waiting + self._num_pending

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def prepare(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        pooling: PoolingParams | None = None,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        arrival: float | None = None,
        n: int = 1,
    ) -> _Stream:
        """One request's stream, not queued yet (:meth:`submit_all` queues it)."""
        loop = asyncio.get_running_loop()
        detokenizer = None
        if params is not None and self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(
                self.tokenizer, stop, include_stop_str_in_output=include_stop_str_in_output
            )
        times = RequestTimes(
            arrival=time.monotonic() if arrival is None else arrival,
            num_prompt_tokens=len(prompt_token_ids),
            max_tokens=params.max_tokens if params is not None else 1,
            n=n,
        )
        stream = _Stream(req_id, list(prompt_token_ids), params, pooling, detokenizer, times, loop)
        stream.num_prompt_tokens = len(prompt_token_ids)
        stream.admitted = loop.create_future()
        return stream

    async def submit_all(self, streams: Sequence[_Stream]) -> None:
        """Queue the requests of one HTTP request together (the core takes them in the same
        loop iteration, so ``n`` samples and a list of prompts are prefilled together) and
        wait until the scheduler took them all.

        Raises:
            InvalidRequestError: the engine refused one (the first refusal); the others are
                aborted: a request is taken whole or not at all.
            EngineDeadError: the engine core is gone.
        """
        if self.failed is not None:
            raise EngineDeadError(f"the engine is not running: {self.failed}")
        with self._lock:
            self._num_pending += len(streams)
            for stream in streams:
                self._streams[stream.req_id] = stream
        for stream in streams:
            self.core.send(
                AddRequest(stream.req_id, stream.prompt_token_ids, stream.params, stream.pooling)
            )
        futures = [s.admitted for s in streams if s.admitted is not None]
        try:
            results = await asyncio.gather(*futures, return_exceptions=True)
        except asyncio.CancelledError:  # the client left while it was being queued
            for stream in streams:
                self.abort(stream.req_id)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for stream in streams:
                self.abort(stream.req_id)
            raise errors[0]

    async def submit(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        **kw: Any,
    ) -> _Stream:
        """:meth:`prepare` and :meth:`submit_all` for one request."""
        stream = self.prepare(req_id, prompt_token_ids, params, **kw)
        await self.submit_all([stream])
        return stream

    def would_exceed_queue_bound(self, num_new: int) -> bool:
        """``num_new`` more waiting requests would pass ``max_num_queued_reqs``."""
        bound = self.max_num_queued_reqs
        return bound is not None and self.num_waiting + num_new > bound

    def abort_all(self) -> None:
        """Abort every request (the drain ran out of time); each stream ends with ``abort``."""
        self.core.send(AbortAll())

    def abort(self, req_id: str) -> None:
        """Abort a request (a client that went away); its KV blocks are freed at once."""
        self.core.send(AbortRequest(req_id))

    async def deltas(self, stream: _Stream) -> AsyncIterator[Delta]:
        """The request's deltas until its last one (``finish_reason`` set); the deltas waiting
        together come as one. Leaving the iteration early (a client gone) aborts the
        request."""
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                while not isinstance(item, BaseException) and item.finish_reason is None:
                    try:
                        more = stream.queue.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                    if isinstance(more, BaseException):
                        item = more
                        break
                    item = item.merge(more)
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(stream.req_id)

    # -- the core client's thread -------------------------------------------------------------
    def _core_failed(self, why: str) -> None:
        logger.error("%s: every request in flight fails", why)
        self.failed = why
        # Nothing runs, waits or holds KV blocks any more: the gauges say so.
        for gauge in (
            self.metrics.num_requests_running,
            self.metrics.num_requests_waiting,
            self.metrics.num_requests_waiting_capacity,
            self.metrics.kv_cache_usage_perc,
        ):
            gauge.set(0)
        out: list[tuple[_Stream, Delta | BaseException]] = []
        now = time.monotonic()
        for stream in list(self._streams.values()):
            self._settle(stream, EngineDeadError(why))
            self._finish(stream, "error", None, out, now, error=why)
        _publish(out)

    def _apply(self, update: StepUpdate) -> None:
        """One step's update: admissions, then each request's delta, then the gauges."""
        now = time.monotonic()
        out: list[tuple[_Stream, Delta | BaseException]] = []
        if update.admissions:
            self._admit(update.admissions)
        metrics = self.metrics
        for record in update.requests:
            stream = self._streams.get(record.req_id)
            if stream is None or stream.done:
                continue  # finished here already (a stop string), or never admitted
            self._progress(stream, record, now, out)
        if update.stepped:
            self.num_steps += 1
            if update.num_iteration_tokens:
                metrics.iteration_tokens.observe(update.num_iteration_tokens)
        with self._lock:
            self._num_waiting = update.num_waiting
        metrics.num_requests_running.set(update.num_running)
        metrics.num_requests_waiting.set(update.num_waiting)
        metrics.num_requests_waiting_capacity.set(update.num_waiting)
        metrics.kv_cache_usage_perc.set(update.kv_cache_usage)
        _publish(out)

    def _admit(self, admissions: list[tuple[str, str | None]]) -> None:
        with self._lock:
            self._num_pending -= len(admissions)
        for req_id, refusal in admissions:
            stream = self._streams.get(req_id)
            if stream is None:
                continue
            if refusal is None:
                self._settle(stream, None)
            else:
                with self._lock:
                    self._streams.pop(req_id, None)
                stream.done = True
                self._settle(stream, InvalidRequestError(refusal))

    @staticmethod
    def _settle(stream: _Stream, error: BaseException | None) -> None:
        def settle() -> None:
            future = stream.admitted
            if future is None or future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            stream.loop.call_soon_threadsafe(settle)

    def _progress(
        self,
        stream: _Stream,
        record: RequestUpdate,
        now: float,
        out: list[tuple[_Stream, Delta | BaseException]],
    ) -> None:
        metrics = self.metrics
        times = stream.times
        if record.first_scheduled:
            times.scheduled = now
            cached = max(0, record.num_cached_tokens)
            times.num_cached_tokens = cached
            stream.num_cached_tokens = cached
            prompt = record.num_prompt_tokens
            metrics.prompt_tokens.inc(prompt)
            metrics.prompt_tokens_by_source["local_compute"].inc(prompt - cached)
            metrics.prompt_tokens_by_source["local_cache_hit"].inc(cached)
            metrics.prompt_tokens_cached.inc(cached)
            metrics.prefix_cache_queries.inc(prompt)
            metrics.prefix_cache_hits.inc(cached)
        if record.num_new_preemptions:
            metrics.num_preemptions.inc(record.num_new_preemptions)
        if stream.pooling is not None:
            if record.finish_reason is not None:
                delta = Delta(
                    [],
                    "",
                    finish_reason=record.finish_reason,
                    num_prompt_tokens=stream.num_prompt_tokens,
                    pooled=record.pooled,
                    error=record.error,
                )
                self._retire(stream, delta, now, out)
            return
        new_ids = record.new_token_ids
        stopped = False
        if new_ids:
            stream.num_output_tokens += len(new_ids)
            metrics.generation_tokens.inc(len(new_ids))
            if times.first_token is None:
                times.first_token = now
                metrics.time_to_first_token.observe(now - times.arrival)
            else:
                assert times.last_token is not None
                metrics.inter_token_latency.observe(now - times.last_token)
            times.last_token = now
            times.num_generation_tokens += len(new_ids)
            if stream.detokenizer is not None:
                stopped = stream.detokenizer.add(new_ids)
        reason: str | None
        if stopped:
            if record.finish_reason is None:
                self.abort(stream.req_id)
            assert stream.detokenizer is not None
            reason = "stop"
            stop_reason: str | int | None = stream.detokenizer.stop_reason
        else:
            reason = record.finish_reason
            stop_reason = record.stop_reason
        if reason is not None:
            self._finish(stream, reason, stop_reason, out, now, record=record, error=record.error)
        elif new_ids:
            out.append((stream, self._delta(stream, record, finished=False)))

    def _delta(self, stream: _Stream, record: RequestUpdate | None, *, finished: bool) -> Delta:
        logprobs = None
        params = stream.params
        if params is not None and params.logprobs is not None:
            chunks = record.new_logprobs if record is not None else []
            logprobs = Logprobs.concat(chunks, params.logprobs)
        detok = stream.detokenizer
        if detok is not None and finished:
            detok.flush()
        text = detok.take(finished) if detok is not None else ""
        return Delta(
            list(record.new_token_ids) if record is not None else [],
            text,
            logprobs,
            num_prompt_tokens=stream.num_prompt_tokens,
            num_output_tokens=stream.num_output_tokens,
            num_cached_tokens=stream.num_cached_tokens,
        )

    def _finish(
        self,
        stream: _Stream,
        reason: str,
        stop_reason: str | int | None,
        out: list[tuple[_Stream, Delta | BaseException]],
        now: float,
        *,
        record: RequestUpdate | None = None,
        error: str | None = None,
    ) -> None:
        delta = self._delta(stream, record, finished=True)
        delta.finish_reason = reason
        delta.stop_reason = stop_reason
        delta.error = error
        self._retire(stream, delta, now, out)

    def _retire(
        self,
        stream: _Stream,
        last: Delta,
        now: float,
        out: list[tuple[_Stream, Delta | BaseException]],
    ) -> None:
        """A request's last delta: it leaves the table, the metrics count its finish, and the
        delta goes out."""
        assert last.finish_reason is not None
        stream.done = True
        with self._lock:
            self._streams.pop(stream.req_id, None)
        self.metrics.request_finished(stream.times, last.finish_reason, now)
        out.append((stream, last))


def _publish(out: list[tuple[_Stream, Delta | BaseException]]) -> None:
    if not out:
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Delta | BaseException]]] = {}
    for stream, item in out:
        by_loop.setdefault(stream.loop, []).append((stream, item))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
            loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[_Stream, Delta | BaseException]]) -> None:
    for stream, item in items:
        stream.queue.put_nowait(item)


__all__ = ["AsyncEngine", "Delta", "EngineDeadError"]
