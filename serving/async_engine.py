"""The server's engine loop: one ``EngineCore`` stepped by one thread, fed from the HTTP event
loop, its outputs handed back to it a step at a time.

Continuous batching: every request of every client is added to the same scheduler, which
packs them into each step (``max_num_seqs``, ``max_num_batched_tokens``); a request that
arrives mid-generation joins the next step. The event loop never waits on a step: it puts
commands (add, abort) into a thread-safe inbox and awaits the request's own
``asyncio.Queue``. After each step the engine thread turns what changed into one
:class:`Delta` per live request (new token ids, their text from the incremental detokenizer,
their logprobs, the finish) and hands the whole step's batch to the loop in one
``call_soon_threadsafe``.

Only the engine thread touches the core, its scheduler and the detokenizers. Stop strings are
matched there too: a match aborts the request in the scheduler at once (its KV blocks freed)
and the client sees ``finish_reason="stop"``, as vLLM reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnout.engine.errors import InvalidRequestError
from turnout.engine.outputs import Logprobs
from turnout.engine.pooling_params import PoolingParams
from turnout.engine.request import Request, RequestStatus
from turnout.engine.sampling_params import SamplingParams
from turnout.serving.detokenize import IncrementalDetokenizer
from turnout.serving.metrics import RequestTimes, ServingMetrics

logger = logging.getLogger("turnout.serving")


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
    request: Request | None = None
    num_sent_ids: int = 0
    num_sent_lp_chunks: int = 0
    num_seen_preemptions: int = 0
    num_seen_computed: int = 0
    done: bool = False


class AsyncEngine:
    """One engine core behind an asyncio interface.

    Args:
        core: the :class:`~turnout.engine.core.EngineCore` (from ``LLM``); only this object's
            thread touches it once :meth:`start` ran.
        tokenizer: for text (``None``: token ids only).
        metrics: the server's :class:`ServingMetrics`.
        recorder: the health recorder reported to the service (``LLM.health_recorder``).
        max_num_queued_reqs: waiting requests at most before :meth:`over_queue_bound` says
            so (``None``: no bound).
    """

    def __init__(
        self,
        core: Any,
        tokenizer: Any,
        metrics: ServingMetrics,
        *,
        recorder: Any = None,
        max_num_queued_reqs: int | None = None,
    ) -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.recorder = recorder
        self.max_num_queued_reqs = max_num_queued_reqs
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._num_pending = 0  # adds in the inbox, not yet in the scheduler
        self._num_waiting = 0  # the scheduler's waiting queue after the last step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turnout-engine", daemon=True)
        self.num_steps = 0
        self.failed: BaseException | None = None

    # -- the event loop's side ----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the engine thread (unfinished requests are aborted)."""
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout_s)

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
        stream.admitted = loop.create_future()
        return stream

    async def submit_all(self, streams: Sequence[_Stream]) -> None:
        """Queue the requests of one HTTP request together (the engine takes them in the same
        loop iteration, so ``n`` samples and a list of prompts are prefilled together) and
        wait until the scheduler took them all.

        Raises:
            InvalidRequestError: the engine refused one (the first refusal); the others are
                aborted: a request is taken whole or not at all.
            RuntimeError: the engine thread is not running.
        """
        if not self._thread.is_alive():
            raise RuntimeError("the engine is not running")
        with self._lock:
            self._num_pending += len(streams)
        for stream in streams:
            self._inbox.put(("add", stream))
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
        self._inbox.put(("abort_all", None))

    def abort(self, req_id: str) -> None:
        """Abort a request (a client that went away); its KV blocks are freed at once."""
        self._inbox.put(("abort", req_id))

    async def deltas(self, stream: _Stream) -> AsyncIterator[Delta]:
        """The request's deltas until its last one (``finish_reason`` set). Leaving the
        iteration early (a client gone) aborts the request."""
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(stream.req_id)

    # -- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        core = self.core
        while not self._stop.is_set():
            idle = not core.has_unfinished_requests()
            commands = self._take_commands(block=idle)
            out: list[tuple[_Stream, Delta | BaseException]] = []
            admitted: list[tuple[_Stream, BaseException | None]] = []
            for kind, arg in commands:
                if kind == "add":
                    admitted.append((arg, self._add(arg)))
                elif kind == "abort":
                    self._abort(arg, out)
                elif kind == "abort_all":
                    for req_id in list(self._streams):
                        self._abort(req_id, out)
            if admitted:
                self._post_admissions(admitted)
            if core.has_unfinished_requests():
                try:
                    core.step()
                    self.num_steps += 1
                except Exception as exc:  # a runner bug: fail what is running, keep serving
                    logger.exception("a step failed; its requests are aborted")
                    core.abort_all()
                    for stream in list(self._streams.values()):
                        self._fail(stream, f"the engine failed: {type(exc).__name__}: {exc}", out)
                else:
                    self._collect(out)
            elif commands:
                self._update_gauges()  # an abort left the engine idle: say so at once
            self._publish(out)
        for stream in list(self._streams.values()):
            with contextlib.suppress(Exception):
                self.core.abort_request(stream.req_id)
            with contextlib.suppress(RuntimeError):  # the event loop is closed already
                stream.loop.call_soon_threadsafe(
                    stream.queue.put_nowait, RuntimeError("the server is shutting down")
                )

    def _take_commands(self, *, block: bool) -> list[tuple[str, Any]]:
        commands: list[tuple[str, Any]] = []
        if block:
            try:
                commands.append(self._inbox.get(timeout=0.5))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _add(self, stream: _Stream) -> BaseException | None:
        with self._lock:
            self._num_pending -= 1
        try:
            if stream.pooling is not None:
                request = self.core.add_request(
                    stream.req_id, stream.prompt_token_ids, pooling_params=stream.pooling
                )
            else:
                request = self.core.add_request(
                    stream.req_id, stream.prompt_token_ids, stream.params
                )
        except InvalidRequestError as exc:
            return exc
        except Exception as exc:  # never lose the request silently
            logger.exception("request %s could not be added", stream.req_id)
            return InvalidRequestError(f"the engine refused the request: {exc}")
        stream.request = request
        self._streams[stream.req_id] = stream
        with self._lock:
            self._num_waiting += 1
        if self.recorder is not None:
            self.recorder.queued(stream.req_id)
        return None

    @staticmethod
    def _post_admissions(admitted: list[tuple[_Stream, BaseException | None]]) -> None:
        def settle(items: list[tuple[_Stream, BaseException | None]]) -> None:
            for stream, error in items:
                future = stream.admitted
                if future is None or future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, BaseException | None]]] = {}
        for stream, error in admitted:
            by_loop.setdefault(stream.loop, []).append((stream, error))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(settle, items)

    def _abort(self, req_id: str, out: list[tuple[_Stream, Delta | BaseException]]) -> None:
        stream = self._streams.get(req_id)
        if stream is None or stream.done:
            return
        self.core.abort_request(req_id)
        self._finish(stream, "abort", None, out, time.monotonic())

    def _fail(
        self, stream: _Stream, error: str, out: list[tuple[_Stream, Delta | BaseException]]
    ) -> None:
        if stream.done:
            return
        self._finish(stream, "error", None, out, time.monotonic(), error=error)

    def _collect(self, out: list[tuple[_Stream, Delta | BaseException]]) -> None:
        """After a step: each live request's delta, the metrics and the health recorder."""
        now = time.monotonic()
        metrics = self.metrics
        num_iteration_tokens = 0
        progress: list[tuple[str, int]] = []
        for stream in list(self._streams.values()):
            req = stream.request
            assert req is not None
            times = stream.times
            computed = req.num_computed_tokens
            if computed > stream.num_seen_computed:
                num_iteration_tokens += computed - stream.num_seen_computed
            stream.num_seen_computed = computed
            if times.scheduled is None and (computed > 0 or req.is_finished):
                times.scheduled = now
                times.num_cached_tokens = max(0, req.num_cached_tokens)
                cached = times.num_cached_tokens
                prompt = req.num_prompt_tokens
                metrics.prompt_tokens.inc(prompt)
                metrics.prompt_tokens_by_source["local_compute"].inc(prompt - cached)
                metrics.prompt_tokens_by_source["local_cache_hit"].inc(cached)
                metrics.prompt_tokens_cached.inc(cached)
                metrics.prefix_cache_queries.inc(prompt)
                metrics.prefix_cache_hits.inc(cached)
            if req.num_preemptions > stream.num_seen_preemptions:
                metrics.num_preemptions.inc(req.num_preemptions - stream.num_seen_preemptions)
                stream.num_seen_preemptions = req.num_preemptions
            if req.pooling:
                if req.is_finished:
                    self._finish_pooling(stream, req, out, now)
                continue
            new_ids = req.output_token_ids[stream.num_sent_ids :]
            stopped = False
            if new_ids:
                stream.num_sent_ids += len(new_ids)
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
                progress.append((stream.req_id, stream.num_sent_ids))
            if stopped and not req.is_finished:
                self.core.abort_request(stream.req_id)
            if stopped or req.is_finished:
                reason = "stop" if stopped else (req.status.finish_reason or "abort")
                stop_reason: str | int | None = (
                    stream.detokenizer.stop_reason
                    if stopped and stream.detokenizer is not None
                    else req.stop_reason
                )
                error = req.error if req.status is RequestStatus.FINISHED_ERROR else None
                self._finish(stream, reason, stop_reason, out, now, new_ids=new_ids, error=error)
            elif new_ids:
                out.append((stream, self._delta(stream, new_ids, finished=False)))
        if num_iteration_tokens:
            metrics.iteration_tokens.observe(num_iteration_tokens)
        if self.recorder is not None and progress:
            self.recorder.observe(progress)
        self._update_gauges()

    def _update_gauges(self) -> None:
        scheduler = self.core.scheduler
        metrics = self.metrics
        num_waiting = len(scheduler.waiting)
        with self._lock:
            self._num_waiting = num_waiting
        metrics.num_requests_running.set(len(scheduler.running))
        metrics.num_requests_waiting.set(num_waiting)
        metrics.num_requests_waiting_capacity.set(num_waiting)
        metrics.kv_cache_usage_perc.set(scheduler.kv_cache_manager.usage)

    def _delta(self, stream: _Stream, new_ids: list[int], *, finished: bool) -> Delta:
        req = stream.request
        assert req is not None
        logprobs = None
        params = stream.params
        if params is not None and params.logprobs is not None:
            chunks = req.logprobs[stream.num_sent_lp_chunks :]
            stream.num_sent_lp_chunks = len(req.logprobs)
            logprobs = Logprobs.concat(chunks, params.logprobs)
        detok = stream.detokenizer
        if detok is not None and finished:
            detok.flush()
        text = detok.take(finished) if detok is not None else ""
        return Delta(
            list(new_ids),
            text,
            logprobs,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=stream.num_sent_ids,
            num_cached_tokens=max(0, req.num_cached_tokens),
        )

    def _finish(
        self,
        stream: _Stream,
        reason: str,
        stop_reason: str | int | None,
        out: list[tuple[_Stream, Delta | BaseException]],
        now: float,
        *,
        new_ids: list[int] | None = None,
        error: str | None = None,
    ) -> None:
        delta = self._delta(stream, new_ids or [], finished=True)
        delta.finish_reason = reason
        delta.stop_reason = stop_reason
        delta.error = error
        self._retire(stream, delta, now, out)

    def _finish_pooling(
        self,
        stream: _Stream,
        req: Request,
        out: list[tuple[_Stream, Delta | BaseException]],
        now: float,
    ) -> None:
        reason = req.status.finish_reason or "abort"
        delta = Delta(
            [],
            "",
            finish_reason=reason,
            num_prompt_tokens=req.num_prompt_tokens,
            pooled=req.pooled_output,
            error=req.error,
        )
        self._retire(stream, delta, now, out)

    def _retire(
        self,
        stream: _Stream,
        last: Delta,
        now: float,
        out: list[tuple[_Stream, Delta | BaseException]],
    ) -> None:
        """A request's last delta: it leaves the table, the metrics and the health recorder
        count its finish, and the delta goes out."""
        assert last.finish_reason is not None
        stream.done = True
        self._streams.pop(stream.req_id, None)
        self.metrics.request_finished(stream.times, last.finish_reason, now)
        if self.recorder is not None:
            self.recorder.finished(stream.req_id, failed=last.finish_reason == "error")
        out.append((stream, last))

    @staticmethod
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


__all__ = ["AsyncEngine", "Delta"]
