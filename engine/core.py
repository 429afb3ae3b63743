"""The engine loop: validate and queue requests, then ``schedule → execute → update`` per step.

Torch-free: the runner is any :class:`~engine.runner_protocol.ModelRunner`. A runner may
return an :class:`~engine.outputs.AsyncModelRunnerOutput`; the loop collects it before the
scheduler applies it. With asynchronous scheduling (a runner whose ``async_scheduling`` is
true: runner_v2) the loop plans and launches step N+1 before it applies step N
(``docs/engine.md``); runner_v1 keeps the synchronous loop.
"""

from __future__ import annotations

import itertools
import operator
import random
from collections.abc import Sequence

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineError, InvalidRequestError
from turnout.engine.kv_cache_manager import cdiv
from turnout.engine.outputs import AsyncModelRunnerOutput, ModelRunnerOutput, SpecDecodeStats
from turnout.engine.pooling_params import PoolingParams
from turnout.engine.request import Request
from turnout.engine.runner_protocol import ModelRunner
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler import Scheduler
from turnout.engine.scheduler_output import SchedulerOutput

_SEED_BITS = 63


class EngineCore:
    """A scheduler driving one runner.

    Args:
        config: the deployment's engine configuration.
        runner: a runner whose KV cache is already initialised with ``num_kv_blocks``.
        num_kv_blocks: blocks of that cache.
    """

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        num_kv_blocks: int,
        *,
        async_scheduling: bool | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        # Asynchronous scheduling when the runner asks for it (runner_v2), unless overridden.
        if async_scheduling is None:
            async_scheduling = bool(getattr(runner, "async_scheduling", False))
        self.async_scheduling = async_scheduling
        # A runner that proposes drafts on the device (runner_v2) never returns their ids: the
        # scheduler reserves k draft positions per decode instead (docs/engine.md).
        device_drafts = (
            config.num_speculative_tokens if getattr(runner, "drafts_on_device", False) else 0
        )
        self.scheduler = Scheduler(
            config,
            num_kv_blocks,
            async_scheduling=async_scheduling,
            num_device_drafts=device_drafts,
        )
        # The step launched but not yet applied (asynchronous scheduling only).
        self._in_flight: (
            tuple[SchedulerOutput, ModelRunnerOutput | AsyncModelRunnerOutput] | None
        ) = None
        self._seed_rng = random.Random(config.seed)
        self._arrival = itertools.count()
        self.num_steps = 0

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        pooling: bool = False,
        pooling_params: PoolingParams | None = None,
    ) -> Request:
        """Validate and queue one request; ``pooling_params`` (or ``pooling=True``: the
        ``embed`` task) makes it a pooling request.

        Raises:
            InvalidRequestError: the prompt or the parameters cannot be served (empty or too
                long prompt, token ids outside the vocabulary, logprobs above
                ``max_logprobs``, an option the runner refuses, a pooling task the model
                does not serve, a duplicate id); nothing was queued, other requests are
                unaffected.
        """
        prompt = _as_token_ids(req_id, prompt_token_ids)
        pooling = pooling or pooling_params is not None
        if pooling and self.config.runner_kind != "pooling":
            raise InvalidRequestError(
                f"request {req_id!r}: {self.config.model} generates text: it serves no pooling requests"
            )
        self._check_prompt(req_id, prompt, pooling)
        if pooling:
            pooling_params = pooling_params if pooling_params is not None else PoolingParams()
            pooling_params.verify(req_id, len(prompt), self.config.pooling_tasks, self.config.model)
            params = None
        else:
            params = sampling_params if sampling_params is not None else SamplingParams()
            params.verify(max_logprobs=self.config.max_logprobs, vocab_size=self.config.vocab_size)
            self.runner.check_sampling_params(params)
            self._check_kv_capacity(req_id, len(prompt), params)
            if params.seed is None:
                params = params.with_seed(self._seed_rng.getrandbits(_SEED_BITS))
        request = Request(
            req_id=req_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            arrival_index=next(self._arrival),
            eos_token_ids=frozenset(self.config.eos_token_ids),
            pooling=pooling,
            pooling_params=pooling_params,
        )
        self.scheduler.add_request(request)
        return request

    def _check_prompt(self, req_id: str, prompt: list[int], pooling: bool) -> None:
        config = self.config
        if req_id in self.scheduler.requests:
            raise InvalidRequestError(f"request id {req_id!r} is already in use")
        if not prompt:
            raise InvalidRequestError(f"request {req_id!r}: the prompt is empty")
        if len(prompt) > config.max_model_len:
            raise InvalidRequestError(
                f"request {req_id!r}: the prompt has {len(prompt)} tokens, more than "
                f"max_model_len={config.max_model_len}"
            )
        bad = [t for t in prompt if not 0 <= t < config.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"request {req_id!r}: token ids {bad[:5]} are outside the vocabulary (size {config.vocab_size})"
            )
        cannot_chunk = pooling or not config.enable_chunked_prefill
        if cannot_chunk and len(prompt) > config.max_num_batched_tokens:
            raise InvalidRequestError(
                f"request {req_id!r}: the prompt has {len(prompt)} tokens, more than "
                f"max_num_batched_tokens={config.max_num_batched_tokens}, and it cannot be "
                f"split ({'pooling' if pooling else 'chunked prefill is off'})"
            )

    def _check_kv_capacity(self, req_id: str, num_prompt: int, params: SamplingParams) -> None:
        # A request needing more blocks than exist would preempt itself forever. Its KV holds
        # at most its prompt, or every token but the last one sampled (that one is never
        # computed); drafts are trimmed to max_tokens / max_model_len, so they add nothing.
        max_len = max(
            num_prompt, min(num_prompt + params.max_tokens, self.config.max_model_len) - 1
        )
        needed = cdiv(max_len, self.config.block_size)
        available = self.scheduler.kv_cache_manager.num_blocks
        if needed > available:
            raise InvalidRequestError(
                f"request {req_id!r} may need {needed} KV blocks ({max_len} tokens), "
                f"the cache has {available}"
            )

    @property
    def spec_decode_stats(self) -> SpecDecodeStats:
        """Speculative decoding counters since start (drafts verified and accepted)."""
        return self.scheduler.spec_decode_stats

    @property
    def last_step_spec_decode_stats(self) -> SpecDecodeStats:
        """Speculative decoding counters of the last step applied."""
        return self.scheduler.last_step_spec_decode_stats

    def abort_request(self, req_id: str) -> Request | None:
        """Finish a request with reason ``abort`` (``None`` when it is unknown or done)."""
        return self.scheduler.abort_request(req_id)

    def abort_all(self) -> list[Request]:
        """Abort every unfinished request and drop the step in flight: what to do when a step
        failed part-way (an exception or a KeyboardInterrupt out of the runner), which leaves
        requests with tokens scheduled but never received. The runner drops their state at
        the next step (``finished_req_ids``); the prefix cache is cleared (see
        :meth:`Scheduler.abort_all`). Returns the aborted requests."""
        self._in_flight = None
        return self.scheduler.abort_all()

    def has_unfinished_requests(self) -> bool:
        """Requests remain, or a launched step is still to be applied."""
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def step(self) -> list[Request]:
        """Run one step; returns the requests that finished in it.

        Raises:
            EngineError: the scheduler can make no progress (a bug, never a bad request).
        """
        if self.async_scheduling:
            return self._step_async()
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            # A step that only preempts (the oldest request preempted itself last) is progress:
            # the next one resumes it with every block free.
            if not scheduler_output.preempted_req_ids and (
                self.scheduler.running or self.scheduler.waiting
            ):
                raise EngineError(
                    f"no progress: {len(self.scheduler.waiting)} waiting and "
                    f"{len(self.scheduler.running)} running requests, nothing schedulable"
                )
            self._apply_bookkeeping(scheduler_output)
            return []
        output = _collect(self.runner.execute_model(scheduler_output))
        self.num_steps += 1
        return self.scheduler.update_from_output(scheduler_output, output)

    def _step_async(self) -> list[Request]:
        # schedule(N+1) -> launch(N+1) -> apply(N): the scheduler plans the next step while
        # the previous one runs; requests count their in-flight tokens as placeholders.
        scheduler_output = self.scheduler.schedule()
        launched = None
        if not scheduler_output.is_empty:
            launched = self.runner.execute_model(scheduler_output)
            self.num_steps += 1
        else:
            self._apply_bookkeeping(scheduler_output)
        previous, self._in_flight = self._in_flight, None
        if launched is not None:
            self._in_flight = (scheduler_output, launched)
        if previous is None:
            if (
                launched is None
                and not scheduler_output.preempted_req_ids
                and (self.scheduler.running or self.scheduler.waiting)
            ):
                raise EngineError(
                    f"no progress: {len(self.scheduler.waiting)} waiting and "
                    f"{len(self.scheduler.running)} running requests, nothing schedulable"
                )
            return []
        previous_output, handle = previous
        return self.scheduler.update_from_output(previous_output, _collect(handle))

    def _apply_bookkeeping(self, scheduler_output: SchedulerOutput) -> None:
        # A step with nothing to compute still finishes and preempts requests: the runner must
        # drop their state (a preemption it never saw would leave a stale row behind, and the
        # resumed request would then find none to replace).
        if scheduler_output.finished_req_ids or scheduler_output.preempted_req_ids:
            self.runner.execute_model(scheduler_output)

    def shutdown(self) -> None:
        """Stop what the runner runs beside this process (the worker ranks of tensor
        parallelism: ``engine.parallel``); idempotent. The engine cannot step after it."""
        shutdown = getattr(self.runner, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def run_until_done(self) -> list[Request]:
        """Step until every request is finished; the finished requests in finishing order."""
        done: list[Request] = []
        while self.has_unfinished_requests():
            done.extend(self.step())
        return done


def _collect(output: ModelRunnerOutput | AsyncModelRunnerOutput) -> ModelRunnerOutput:
    """A step's results, waiting for them when the runner returned a handle. The concrete class
    is checked first: ``isinstance`` against the runtime-checkable protocol costs microseconds."""
    if not isinstance(output, ModelRunnerOutput) and isinstance(output, AsyncModelRunnerOutput):
        output = output.get_output()
    assert isinstance(output, ModelRunnerOutput)
    return output


def _as_token_ids(req_id: str, prompt_token_ids: Sequence[int]) -> list[int]:
    """The prompt as Python ints: any integer type is accepted (numpy arrays, ``torch``
    tensors' elements), through ``__index__``, which floats and strings do not have."""
    out = []
    for token in prompt_token_ids:
        try:
            out.append(operator.index(token))
        except TypeError:
            raise InvalidRequestError(
                f"request {req_id!r}: token ids must be integers, got {token!r} ({type(token).__name__})"
            ) from None
    return out


__all__ = ["EngineCore"]
