"""What the scheduler tells a runner each step (vLLM V1's ``SchedulerOutput`` shapes).

New requests come with full data, once. Requests the runner already knows come as diffs
(new blocks, progress). A request resumed after preemption is a cached request with
``resumed_from_preemption`` set: its ``new_block_ids`` then *replace* its block list and
``resumed_req_token_ids`` carries its whole token list (prompt and output so far), because a
runner drops a preempted request's batch state. Ordering contract (docs/architecture.md §5.5):
runners apply ``finished_req_ids`` and ``preempted_req_ids`` before binding any new metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnout.engine.pooling_params import PoolingParams
from turnout.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner sees for the first time.

    Attributes:
        req_id: the request's id.
        prompt_token_ids: ``[num_prompt_tokens]`` ids.
        sampling_params: seeded parameters; ``None`` for pooling requests.
        block_ids: its physical KV blocks in token order (empty for pooling).
        num_computed_tokens: tokens whose KV is already in those blocks (prefix-cache hits).
        pooling: a pooling request (one forward of the whole prompt, a pooled output, no
            sampling).
        pooling_params: its task and token types (pooling requests).
    """

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None
    block_ids: list[int]
    num_computed_tokens: int
    pooling: bool = False
    pooling_params: PoolingParams | None = None


@dataclass
class CachedRequestData:
    """Diffs for requests the runner already holds, as parallel lists (one entry per request).

    Attributes:
        req_ids: ids of the scheduled requests.
        resumed_from_preemption: ``True`` for a request coming back after preemption.
        resumed_req_token_ids: for a resumed request, its full token list (prompt + output);
            ``None`` otherwise.
        new_block_ids: blocks appended this step (``None``: none); for a resumed request, its
            complete new block list.
        num_computed_tokens: tokens with KV before this step.
        num_output_tokens: output tokens the engine has accepted so far (a runner that keeps
            sampled ids itself can check it is in step).
    """

    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    resumed_req_token_ids: list[list[int] | None] = field(default_factory=list)
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def append(
        self,
        req_id: str,
        *,
        resumed: bool,
        token_ids: list[int] | None,
        new_block_ids: list[int] | None,
        num_computed_tokens: int,
        num_output_tokens: int,
    ) -> None:
        self.req_ids.append(req_id)
        self.resumed_from_preemption.append(resumed)
        self.resumed_req_token_ids.append(token_ids)
        self.new_block_ids.append(new_block_ids)
        self.num_computed_tokens.append(num_computed_tokens)
        self.num_output_tokens.append(num_output_tokens)

    def extend_running(
        self,
        req_ids: list[str],
        new_block_ids: list[list[int] | None],
        num_computed_tokens: list[int],
        num_output_tokens: list[int],
    ) -> None:
        """Append requests that keep running (not resumed, no token list), one per entry of
        the parallel lists: :meth:`append` for a whole step at once."""
        n = len(req_ids)
        self.req_ids.extend(req_ids)
        self.resumed_from_preemption.extend([False] * n)
        self.resumed_req_token_ids.extend([None] * n)
        self.new_block_ids.extend(new_block_ids)
        self.num_computed_tokens.extend(num_computed_tokens)
        self.num_output_tokens.extend(num_output_tokens)


@dataclass
class SchedulerOutput:
    """One step's plan.

    Attributes:
        scheduled_new_reqs: requests scheduled for the first time.
        scheduled_cached_reqs: running and resumed requests (diffs).
        num_scheduled_tokens: ``req_id -> tokens to compute this step`` (drafts included).
        total_num_scheduled_tokens: their sum, ``<= max_num_batched_tokens``.
        scheduled_spec_decode_tokens: ``req_id -> draft ids`` scheduled for verification;
            they are the last ``len(drafts)`` of the request's scheduled tokens.
        finished_req_ids: requests finished (or aborted) since the last step: drop them.
        preempted_req_ids: requests preempted in this step: drop their batch state (they
            come back later as resumed cached requests).
    """

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)

    @property
    def num_reqs(self) -> int:
        return len(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        """Nothing to compute (the runner still applies ``finished_req_ids``)."""
        return self.total_num_scheduled_tokens == 0


__all__ = ["CachedRequestData", "NewRequestData", "SchedulerOutput"]
