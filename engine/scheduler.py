"""FCFS continuous batching with chunked prefill and preemption by recompute.

Each step (vLLM V1's unified scheduler, no separate prefill/decode phases):

1. Running requests, oldest first, get ``num_tokens_with_spec - num_computed_tokens`` tokens
   (a decode: 1 plus drafts; a prompt still being prefilled: its next chunk), within the
   token budget ``max_num_batched_tokens``. When KV blocks run out, the newest running
   request is preempted (its blocks freed, ``num_computed_tokens`` back to 0, requeued by
   arrival) until the allocation fits or the request preempts itself.
2. If nothing was preempted, waiting requests (FCFS; resumed ones by their original arrival)
   start while budget, ``max_num_seqs`` and blocks allow, after a prefix-cache lookup. With
   chunked prefill a prompt larger than the remaining budget gets a chunk; without it, waiting
   stops at the first prompt that does not fit.

``num_computed_tokens`` advances when a step is scheduled; :meth:`Scheduler.update_from_output`
appends the sampled tokens, rolls back rejected drafts, checks stop conditions and frees
finished requests. Asynchronous scheduling (``async_scheduling=True``: planning step N+1
before step N's tokens are known) counts a request's in-flight tokens in
``num_output_placeholders``: a decode is scheduled from them, the block for the token is
reserved, and ``update_from_output`` turns them into tokens (see ``docs/engine.md``).

Drafts proposed on the device (``num_device_drafts``: runner_v2's ``ngram_gpu`` and
``draft_model``) are never seen by the host: a decode is scheduled with ``1 + s`` tokens, ``s``
draft placeholders (at most ``num_device_drafts``, within ``max_tokens`` and ``max_model_len``),
as if every draft will be accepted; ``num_computed_tokens`` and the placeholders count all of
them, and ``update_from_output`` takes back the rejected ones when the step's tokens arrive (one
step later under asynchronous scheduling). The KV blocks reserved for the optimistic positions
cover the real ones, which are never further on; rejected positions are written again.
"""

from __future__ import annotations

import bisect

from turnout.engine.block_pool import KVCacheBlock
from turnout.engine.config import EngineConfig
from turnout.engine.kv_cache_manager import KVCacheManager
from turnout.engine.outputs import ModelRunnerOutput, PromptLogprobs, SpecDecodeStats
from turnout.engine.request import Request, RequestStatus
from turnout.engine.scheduler_output import NewRequestData, SchedulerOutput


def _by_arrival(request: Request) -> int:
    return request.arrival_index


# A step's running-request diffs: req_ids, new_block_ids, num_computed_tokens, num_output_tokens.
_Diffs = tuple[list[str], list[list[int] | None], list[int], list[int]]
_RUNNING = RequestStatus.RUNNING


class Scheduler:
    """Plans each step and applies its results.

    Args:
        config: ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
            ``block_size``, ``enable_chunked_prefill``, ``enable_prefix_caching``.
        num_kv_blocks: physical KV blocks the runner allocated.
    """

    def __init__(
        self,
        config: EngineConfig,
        num_kv_blocks: int,
        *,
        async_scheduling: bool = False,
        num_device_drafts: int = 0,
    ) -> None:
        self.config = config
        self.async_scheduling = async_scheduling
        # Drafts per decode the runner proposes on the device (0: drafts come from its output).
        self.num_device_drafts = num_device_drafts
        # Speculative decoding counters: since start, and of the last step applied.
        self.spec_decode_stats = SpecDecodeStats()
        self.last_step_spec_decode_stats = SpecDecodeStats()
        self.kv_cache_manager = KVCacheManager(
            num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []  # sorted by arrival_index
        self.running: list[Request] = []  # sorted by arrival_index
        self._finished_req_ids: set[str] = set()  # to tell the runner at the next step
        # The requests each unapplied step scheduled (by id of its SchedulerOutput): a result
        # applies only to the very request it was computed for, even if a finished request's
        # id has been reused meanwhile (possible while a step is in flight).
        self._scheduled: dict[int, dict[str, Request]] = {}

    # ---- requests in and out ----------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a validated request (the engine core checks it first)."""
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        self.requests[request.req_id] = request
        bisect.insort(self.waiting, request, key=_by_arrival)

    def abort_request(self, req_id: str) -> Request | None:
        """Finish an unfinished request with reason ``abort``; ``None`` if unknown."""
        request = self.requests.get(req_id)
        if request is None:
            return None
        self._finish(request, RequestStatus.FINISHED_ABORTED)
        return request

    def abort_all(self) -> list[Request]:
        """Abort every unfinished request and forget the steps not yet applied (after a step
        failed part-way). The prefix cache is cleared too: blocks are entered into it when
        they are allocated, before the step that computes them has run."""
        aborted = [request for request in list(self.requests.values())]
        for request in aborted:
            self._finish(request, RequestStatus.FINISHED_ABORTED)
        self._scheduled.clear()
        self.kv_cache_manager.reset_prefix_cache()
        return aborted

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- planning --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan one step (see the module docstring)."""
        out = SchedulerOutput(finished_req_ids=self._finished_req_ids)
        self._finished_req_ids = set()
        scheduled: dict[str, Request] = {}  # in the order of out.num_scheduled_tokens
        running_diffs: _Diffs = ([], [], [], [])
        budget = self._schedule_running(
            out, self.config.max_num_batched_tokens, scheduled, running_diffs
        )
        if not out.preempted_req_ids:
            budget = self._schedule_waiting(out, budget, scheduled)
        # Running requests' diffs come after the resumed ones (appended while binding those).
        out.scheduled_cached_reqs.extend_running(*running_diffs)
        out.total_num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        if scheduled:
            self._scheduled[id(out)] = scheduled
        return out

    def _schedule_running(
        self, out: SchedulerOutput, budget: int, scheduled: dict[str, Request], diffs: _Diffs
    ) -> int:
        # Each request's progress advances as soon as it is planned: nothing later in the step
        # reads it (preemption only takes requests after it, not yet planned).
        running = self.running
        allocate = self.kv_cache_manager.allocate_slots
        num_scheduled = out.num_scheduled_tokens
        req_ids, new_block_ids, num_computed, num_output = diffs
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            num_new = self._num_new_tokens_running(request, budget)
            if num_new <= 0:
                i += 1
                continue
            blocks = allocate(request, num_new)
            if blocks is None:
                blocks = self._preempt_until_allocated(request, num_new, out)
                if blocks is None:
                    break  # the request preempted itself; everything after it is gone too
            req_id = request.req_id
            num_scheduled[req_id] = num_new
            scheduled[req_id] = request
            req_ids.append(req_id)
            new_block_ids.append([b.block_id for b in blocks] if blocks else None)
            num_computed.append(request.num_computed_tokens)
            # In flight tokens included: the runner produced them, the engine awaits them.
            num_output.append(request.num_output_tokens + request.num_output_placeholders)
            num_drafts = (
                request.num_computed_tokens
                + num_new
                - request.num_tokens
                - request.num_output_placeholders
            )
            if num_drafts > 0:
                self._schedule_drafts(request, num_drafts, out)
            else:
                num_drafts = 0
            self._advance(request, num_new, num_drafts)
            budget -= num_new
            i += 1
        return budget

    def _num_new_tokens_running(self, request: Request, budget: int) -> int:
        placeholders = request.num_output_placeholders
        if placeholders and (
            request.num_output_tokens + placeholders >= request.max_tokens
            or request.num_tokens + placeholders >= self.config.max_model_len
        ):
            return 0  # its last token is in flight: it finishes when that step is applied
        num_computed = request.num_computed_tokens
        num_new = request.num_tokens + len(request.spec_token_ids) + placeholders - num_computed
        if self.num_device_drafts and num_new == 1 and num_computed >= request.num_prompt_tokens:
            num_new += self._num_device_drafts(request)
        # Never compute a position at or past max_model_len (drafts could reach it).
        return min(num_new, budget, self.config.max_model_len - num_computed)

    def _num_device_drafts(self, request: Request) -> int:
        # A decode verifies up to num_device_drafts drafts; its k drafts yield up to k + 1
        # tokens, counted from the optimistic placeholders: stay within max_tokens and
        # max_model_len even if every draft in flight is accepted.
        ahead = request.num_output_placeholders
        room = min(
            request.max_tokens - request.num_output_tokens - ahead - 1,
            self.config.max_model_len - request.num_tokens - ahead - 1,
        )
        return max(0, min(self.num_device_drafts, room))

    def _schedule_drafts(self, request: Request, num_drafts: int, out: SchedulerOutput) -> None:
        # Device drafts are placeholders: their ids never reach the host.
        drafts = (
            [-1] * num_drafts if self.num_device_drafts else request.spec_token_ids[:num_drafts]
        )
        out.scheduled_spec_decode_tokens[request.req_id] = drafts

    def _advance(self, request: Request, num_new: int, num_drafts: int) -> None:
        request.num_computed_tokens += num_new
        if (
            self.async_scheduling
            and not request.pooling
            and (
                request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders
            )
        ):
            # This step samples a token not yet seen, and may accept every draft it verifies.
            request.num_output_placeholders += 1 + num_drafts

    def _preempt_until_allocated(
        self, request: Request, num_new: int, out: SchedulerOutput
    ) -> list[KVCacheBlock] | None:
        while True:
            victim = self.running.pop()  # newest first (running is sorted by arrival)
            self._preempt(victim, out)
            if victim is request:
                return None
            blocks = self.kv_cache_manager.allocate_slots(request, num_new)
            if blocks is not None:
                return blocks

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        bisect.insort(self.waiting, request, key=_by_arrival)
        out.preempted_req_ids.add(request.req_id)

    def _schedule_waiting(
        self, out: SchedulerOutput, budget: int, scheduled: dict[str, Request]
    ) -> int:
        config = self.config
        while self.waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.waiting[0]
            if request.num_output_placeholders:
                break  # preempted with a token in flight: resume once its token list is known
            hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit_tokens
            if num_new > budget and (request.pooling or not config.enable_chunked_prefill):
                break  # FCFS: later requests wait behind this one
            num_new = min(num_new, budget)
            if not request.pooling:
                blocks = self.kv_cache_manager.allocate_slots(request, num_new, hits)
                if blocks is None:
                    break
            self.waiting.pop(0)
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            self._bind(request, out)
            out.num_scheduled_tokens[request.req_id] = num_new
            scheduled[request.req_id] = request
            self._advance(request, num_new, 0)
            budget -= num_new
        return budget

    def _bind(self, request: Request, out: SchedulerOutput) -> None:
        block_ids = self.kv_cache_manager.get_block_ids(request.req_id)
        if request.status == RequestStatus.PREEMPTED:
            out.scheduled_cached_reqs.append(
                request.req_id,
                resumed=True,
                token_ids=list(request.all_token_ids),
                new_block_ids=block_ids,
                num_computed_tokens=request.num_computed_tokens,
                num_output_tokens=request.num_output_tokens,
            )
        else:
            out.scheduled_new_reqs.append(
                NewRequestData(
                    req_id=request.req_id,
                    prompt_token_ids=list(request.prompt_token_ids),
                    sampling_params=request.sampling_params,
                    block_ids=block_ids,
                    num_computed_tokens=request.num_computed_tokens,
                    pooling=request.pooling,
                    pooling_params=request.pooling_params,
                )
            )
        request.status = RequestStatus.RUNNING
        bisect.insort(self.running, request, key=_by_arrival)

    # ---- results -----------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[Request]:
        """Apply one step's results; returns the requests that finished in it."""
        self.last_step_spec_decode_stats = SpecDecodeStats()
        req_ids = runner_output.req_ids
        index = dict(zip(req_ids, range(len(req_ids)), strict=True))
        sampled = runner_output.sampled_token_ids
        spec = scheduler_output.scheduled_spec_decode_tokens
        requests = self.requests
        # A step without errors, drafts or prompt logprobs only appends tokens (most decodes).
        plain = not (runner_output.errors or spec or runner_output.prompt_logprobs)
        finished: list[Request] = []
        # The requests the step scheduled, in its order (none if it was forgotten: abort_all).
        for req_id, request in self._scheduled.pop(id(scheduler_output), {}).items():
            if requests.get(req_id) is not request or (
                request.status is not _RUNNING and request.is_finished
            ):
                continue  # finished or aborted since it was scheduled (its id may be reused)
            # A request preempted while this step was in flight (asynchronous scheduling)
            # still takes the step's token: its resumed token list must include it.
            i = index.get(req_id)
            generated = sampled[i] if i is not None else []
            if self.async_scheduling and request.num_output_placeholders and generated:
                # The step's sampled token and its drafts, accepted or not, are no longer ahead.
                num_drafts = len(spec.get(req_id, ()))
                request.num_output_placeholders = max(
                    0, request.num_output_placeholders - 1 - num_drafts
                )
            if plain and not request.pooling and not request.spec_token_ids:
                status = self._append_tokens(request, runner_output, generated)
            else:
                status = self._apply(request, scheduler_output, runner_output, generated)
            if status is not None:
                self._finish(request, status)
                finished.append(request)
        return finished

    def _apply(
        self,
        request: Request,
        so: SchedulerOutput,
        ro: ModelRunnerOutput,
        generated: list[int],
    ) -> RequestStatus | None:
        req_id = request.req_id
        if ro.errors and req_id in ro.errors:
            request.error = ro.errors[req_id]
            return RequestStatus.FINISHED_ERROR
        drafts = (
            so.scheduled_spec_decode_tokens.get(req_id) if so.scheduled_spec_decode_tokens else None
        )
        if drafts and generated:
            self._observe_drafts(
                request, len(drafts), ro.num_draft_tokens.get(req_id, len(drafts)), generated
            )
        if request.spec_token_ids:
            request.spec_token_ids = []
        chunk = ro.prompt_logprobs.get(req_id) if ro.prompt_logprobs else None
        if chunk is not None:
            self._take_prompt_logprobs(request, chunk)
        if request.pooling:
            pooled = ro.pooled_outputs.get(req_id)
            if pooled is None:
                return None  # not done yet (never happens: pooling runs in one step)
            request.pooled_output = [float(x) for x in pooled]
            return RequestStatus.FINISHED_STOPPED
        return self._append_tokens(request, ro, generated)

    def _append_tokens(
        self, request: Request, ro: ModelRunnerOutput, generated: list[int]
    ) -> RequestStatus | None:
        status = None
        num_kept = 0
        max_model_len = self.config.max_model_len
        for token_id in generated:
            request.append_output_token(token_id)
            num_kept += 1
            status = request.check_stop(max_model_len)
            if status is not None:
                break
        if num_kept and ro.logprobs:
            logprobs = ro.logprobs.get(request.req_id)
            if logprobs is not None:
                request.logprobs.append(logprobs.slice(0, num_kept))
        if status is None and generated and ro.spec_token_ids:
            request.spec_token_ids = self._trim_drafts(
                request, ro.spec_token_ids.get(request.req_id)
            )
        return status

    def _observe_drafts(
        self, request: Request, num_scheduled: int, num_verified: int, generated: list[int]
    ) -> None:
        # The rejected drafts' positions are not computed: take them back (unless the request
        # was preempted while the step was in flight: it starts from 0 again).
        if request.status == RequestStatus.RUNNING:
            request.num_computed_tokens -= num_scheduled + 1 - len(generated)
        num_accepted = len(generated) - 1
        for stats in (
            request.spec_decode,
            self.spec_decode_stats,
            self.last_step_spec_decode_stats,
        ):
            stats.observe(num_verified, num_accepted)

    def _trim_drafts(self, request: Request, drafts: list[int] | None) -> list[int]:
        if not drafts:
            return []
        # k drafts yield up to k + 1 tokens: stay within max_tokens and max_model_len.
        room = min(
            request.max_tokens - request.num_output_tokens - 1,
            self.config.max_model_len - request.num_tokens - 1,
        )
        return list(drafts[: max(0, room)])

    @staticmethod
    def _take_prompt_logprobs(request: Request, chunk: PromptLogprobs) -> None:
        # Entries for prompt tokens 1..num_prompt_logprobs are in; keep only what is new, so
        # a range recomputed after preemption is delivered once.
        have = request.num_prompt_logprobs
        end = chunk.start + len(chunk.logprobs)  # one past the last token covered
        if end <= have + 1:
            return
        if chunk.start > have + 1:
            raise RuntimeError(
                f"request {request.req_id}: prompt logprobs from token {chunk.start} "
                f"arrived before tokens {have + 1}..{chunk.start - 1}"
            )
        request.prompt_logprobs.append(
            chunk.logprobs.slice(have + 1 - chunk.start, len(chunk.logprobs))
        )
        request.num_prompt_logprobs = end - 1

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        request.spec_token_ids = []
        request.num_output_placeholders = 0  # tokens still in flight for it are discarded
        self.kv_cache_manager.free(request)
        del self.requests[request.req_id]
        self._finished_req_ids.add(request.req_id)


__all__ = ["Scheduler"]
