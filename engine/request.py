"""One request's life in the engine: its tokens, its progress, its state and why it finished.

Lifecycle (explicit, docs/architecture.md §5.5): ``WAITING`` → ``RUNNING`` ⇄ ``PREEMPTED``
(recompute: its KV blocks are freed and ``num_computed_tokens`` goes back to 0) → one of the
``FINISHED_*`` states. A finished request never comes back; its id may be reused by a new request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from turnout.engine.outputs import SpecDecodeStats
from turnout.engine.pooling_params import PoolingParams
from turnout.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from turnout.engine.outputs import Logprobs


class RequestStatus(enum.Enum):
    """Where a request is in its lifecycle."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH_CAPPED = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self._value_ in _FINISHED_VALUES  # _value_: a plain attribute, unlike value

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish reasons: ``stop``, ``length``, ``abort`` (plus ``error``)."""
        return self.value if self.is_finished else None


_FINISHED_VALUES = frozenset({"stop", "length", "abort", "error"})


@dataclass(eq=False)
class Request:
    """The engine's record of one request (the scheduler and the KV manager share it).

    Attributes:
        req_id: caller-chosen id, unique among unfinished requests.
        prompt_token_ids: the prompt, ``num_prompt_tokens >= 1`` ids.
        sampling_params: how to sample (``None`` for pooling requests); always seeded here.
        arrival_index: monotonic order of arrival; FCFS priority (lower first) and the key
            of "newest first" preemption.
        eos_token_ids: the model's EOS ids (stop unless ``ignore_eos``).
        pooling: a pooling request (one step, no KV blocks, no sampling).
        pooling_params: its task and token types (``None``: not a pooling request).

    ``num_prompt_tokens``, ``num_tokens`` (``len(all_token_ids)``) and ``num_output_tokens``
    (``len(output_token_ids)``) are plain ints kept in step with the lists: extend the output
    only through :meth:`append_output_token`.
    """

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None
    arrival_index: int
    eos_token_ids: frozenset[int] = frozenset()
    pooling: bool = False
    pooling_params: PoolingParams | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Draft tokens proposed by the runner (n-gram speculation), scheduled next step.
    spec_token_ids: list[int] = field(default_factory=list)
    # Drafts verified and accepted over the request's life (speculative decoding).
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    num_computed_tokens: int = 0
    # Asynchronous scheduling: tokens sampled by steps still in flight (their ids unknown yet).
    num_output_placeholders: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit of the first scheduling; -1 = not yet
    num_preemptions: int = 0
    stop_reason: int | None = None
    error: str | None = None
    # Hashes of the full blocks of all_token_ids (prefix caching), filled by the KV manager.
    block_hashes: list[bytes] = field(default_factory=list)
    logprobs: list[Logprobs] = field(default_factory=list)
    prompt_logprobs: list[Logprobs] = field(default_factory=list)
    num_prompt_logprobs: int = 0  # prompt-logprob entries received (tokens 1..this)
    pooled_output: list[float] | None = None

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        # Counts kept as ints beside the lists: the scheduler reads them several times per
        # request and step, where len() through a property cost a call each time.
        self.num_prompt_tokens: int = len(self.prompt_token_ids)
        self.num_tokens: int = len(self.all_token_ids)  # prompt plus output (drafts excluded)
        self.num_output_tokens: int = len(self.output_token_ids)
        #: Output tokens at most (1 for pooling): fixed with ``sampling_params`` at construction.
        self.max_tokens: int = (
            1 if self.sampling_params is None else self.sampling_params.max_tokens
        )

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling_params is not None and self.sampling_params.prompt_logprobs is not None

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.num_output_tokens += 1
        self.num_tokens += 1

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """The finished state the last appended token leads to, or ``None``.

        Order: EOS (unless ``ignore_eos``), then ``stop_token_ids`` — both only once
        ``min_tokens`` are out — then ``max_tokens``, then ``max_model_len``.
        """
        params = self.sampling_params
        assert params is not None, "pooling requests do not sample"
        last = self.output_token_ids[-1]
        num_output = self.num_output_tokens
        if num_output >= params.min_tokens:
            if not params.ignore_eos and last in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if last in params.stop_token_ids:
                self.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if num_output >= params.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None


__all__ = ["Request", "RequestStatus"]
