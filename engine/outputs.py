"""What runners return each step and what the engine returns to callers.

Logprobs travel as compact arrays, never as per-token dicts (a full-vocabulary request would
otherwise cost tens of bytes per entry): ``Logprobs`` holds ``n`` positions, column 0 is the
sampled (or actual prompt) token and columns ``1..k`` the ``k`` most likely tokens, most likely
first, ties to the lower token id (vLLM's ``LogprobsLists`` layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


class Logprob(NamedTuple):
    """One token's log-probability and its rank (1 = most likely; ties share the worse rank)."""

    logprob: float
    rank: int


@dataclass(frozen=True)
class Logprobs:
    """Logprobs of ``n`` consecutive positions of one request.

    Attributes:
        token_ids: ``[n, 1 + k] int32``.
        logprobs: ``[n, 1 + k] float32`` (natural log).
        ranks: ``[n] int32``, rank of the column-0 token among the whole vocabulary, counted as
            the number of tokens whose logprob is ``>=`` its own (vLLM's definition).
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    ranks: np.ndarray

    def __post_init__(self) -> None:
        n = self.ranks.shape[0]
        if (
            self.token_ids.shape != self.logprobs.shape
            or self.token_ids.ndim != 2
            or self.token_ids.shape[0] != n
        ):
            raise ValueError(
                f"inconsistent shapes: token_ids {self.token_ids.shape}, "
                f"logprobs {self.logprobs.shape}, ranks {self.ranks.shape}"
            )

    def __len__(self) -> int:
        return int(self.ranks.shape[0])

    @property
    def num_logprobs(self) -> int:
        """``k``: top tokens per position (besides column 0)."""
        return int(self.token_ids.shape[1]) - 1

    @classmethod
    def empty(cls, num_logprobs: int) -> Logprobs:
        return cls(
            np.zeros((0, num_logprobs + 1), np.int32),
            np.zeros((0, num_logprobs + 1), np.float32),
            np.zeros((0,), np.int32),
        )

    @classmethod
    def concat(cls, chunks: Sequence[Logprobs], num_logprobs: int) -> Logprobs:
        """Positions of ``chunks`` one after the other."""
        if not chunks:
            return cls.empty(num_logprobs)
        if len(chunks) == 1:
            return chunks[0]
        return cls(
            np.concatenate([c.token_ids for c in chunks]),
            np.concatenate([c.logprobs for c in chunks]),
            np.concatenate([c.ranks for c in chunks]),
        )

    def slice(self, start: int, stop: int) -> Logprobs:
        return Logprobs(
            self.token_ids[start:stop], self.logprobs[start:stop], self.ranks[start:stop]
        )

    def position(self, i: int) -> dict[int, Logprob]:
        """Position ``i`` as vLLM's ``{token_id: Logprob}`` (the column-0 token included)."""
        ids, lps = self.token_ids[i].tolist(), self.logprobs[i].tolist()
        out = {
            tok: Logprob(lp, rank)
            for rank, (tok, lp) in enumerate(zip(ids[1:], lps[1:], strict=True), 1)
        }
        out.setdefault(ids[0], Logprob(lps[0], int(self.ranks[i])))
        return out

    def sampled_logprobs(self) -> list[float]:
        """Logprob of each position's column-0 token."""
        logprobs: list[float] = self.logprobs[:, 0].tolist()
        return logprobs


@dataclass(frozen=True)
class PromptLogprobs:
    """Prompt logprobs of consecutive prompt tokens ``start .. start + len(logprobs) - 1``.

    Token ``0`` has none (nothing predicts it), so ``start >= 1``. A chunked prefill delivers
    several of these; a preempted request may deliver a range again — the engine keeps the
    first delivery of each token only.
    """

    start: int
    logprobs: Logprobs


@dataclass
class SpecDecodeStats:
    """Speculative decoding counters, of one request or of the engine (vLLM's
    ``SpecDecodingStats`` names).

    Attributes:
        num_drafts: verification steps that checked at least one draft token.
        num_draft_tokens: draft tokens verified (a proposer may offer fewer than scheduled:
            n-gram finds no match; those count as neither drafted nor accepted).
        num_accepted_tokens: draft tokens accepted.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verification of ``num_draft_tokens`` drafts, ``num_accepted_tokens`` accepted."""
        if num_draft_tokens > 0:
            self.num_drafts += 1
            self.num_draft_tokens += num_draft_tokens
            self.num_accepted_tokens += min(num_accepted_tokens, num_draft_tokens)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified draft tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verification step yields on average: ``1 + accepted / drafts`` (vLLM's
        "mean acceptance length", the bonus token included); 1 before any draft."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def as_dict(self) -> dict[str, float]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


@dataclass
class ModelRunnerOutput:
    """One step's results.

    Attributes:
        req_ids: the scheduled requests, in the runner's batch order.
        sampled_token_ids: per request (same order), the tokens it produced this step: ``[]``
            for a partial prefill, one token normally, several when drafts were accepted.
        logprobs: ``req_id -> Logprobs`` with one row per sampled token (requests asking).
        prompt_logprobs: ``req_id -> PromptLogprobs`` for the prompt tokens scored this step.
        spec_token_ids: ``req_id -> draft ids`` proposed for the next step (drafts kept on the
            host: runner_v1's n-gram).
        num_draft_tokens: ``req_id -> drafts verified this step`` where fewer than the
            scheduled ones held a proposal (drafts proposed on the device: a missing entry
            means every scheduled draft was one).
        pooled_outputs: ``req_id -> [D] float32`` pooled output of a pooling request: an
            embedding (``D = hidden_size``) or a head's logits (``D = num_labels``).
        errors: ``req_id -> message`` for requests that failed alone this step (e.g. a
            logits processor raised); the engine finishes them with reason ``error``.
    """

    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    num_draft_tokens: dict[str, int] = field(default_factory=dict)
    pooled_outputs: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.req_ids) != len(self.sampled_token_ids):
            raise ValueError("req_ids and sampled_token_ids must have one entry per request")


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput(req_ids=[], sampled_token_ids=[])


@runtime_checkable
class AsyncModelRunnerOutput(Protocol):
    """A step still running on the device; ``get_output()`` waits for it (runner_v2)."""

    def get_output(self) -> ModelRunnerOutput: ...


@dataclass
class CompletionOutput:
    """The generated continuation of one request."""

    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: int | None = None
    logprobs: Logprobs | None = None


@dataclass
class RequestOutput:
    """The result of one generate request.

    Attributes:
        prompt_logprobs: one entry per prompt token after the first (``num_prompt_tokens - 1``
            rows, delivered once), or ``None`` when not asked for.
        error: why the request was rejected or failed (``outputs[0].finish_reason == "error"``).
        spec_decode: its speculative decoding counters (``None`` without speculation).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: Logprobs | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    error: str | None = None
    spec_decode: SpecDecodeStats | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


@dataclass
class EmbeddingOutput:
    """The result of one embed request: an L2-normalised ``[hidden_size]`` float32 vector (as
    Python floats), or the error."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    embedding: list[float] | None
    error: str | None = None


@dataclass
class ClassificationOutput:
    """The result of one classify request.

    Attributes:
        logits: ``[num_labels]`` float32 head outputs (HF ``logits``), or ``None`` on error.
        probs: ``[num_labels]``: ``softmax(logits)``, or ``sigmoid(logits)`` for one label.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    logits: list[float] | None
    probs: list[float] | None
    error: str | None = None


@dataclass
class ScoringOutput:
    """The result of scoring one ``(query, document)`` pair with a cross-encoder.

    Attributes:
        document: the document's text (``None`` for token ids).
        prompt_token_ids: the pair, ``[CLS] query [SEP] document [SEP]``.
        token_type_ids: 0 for the query segment, 1 for the document's.
        score: the one label's logit under the model's cross-encoder activation (float32
            computed, a Python float): sigmoid, or none when the config names Identity.
    """

    request_id: str
    document: str | None
    prompt_token_ids: list[int]
    token_type_ids: list[int]
    score: float | None
    error: str | None = None


@dataclass
class RerankResult:
    """One document of a rerank (vLLM's ``/rerank`` result shape): its index in the documents
    given, the document, and its ``relevance_score`` (the ``score``; ``None`` with ``error``
    for a document that could not be scored)."""

    index: int
    document: str | Sequence[int]
    relevance_score: float | None
    error: str | None = None


@dataclass
class RewardOutput:
    """The result of one reward request: the head's ``[num_labels]`` float32 outputs at the
    prompt's last token, without activation (a reward model's score is the raw logit)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    reward: list[float] | None
    error: str | None = None


__all__ = [
    "EMPTY_MODEL_RUNNER_OUTPUT",
    "AsyncModelRunnerOutput",
    "ClassificationOutput",
    "CompletionOutput",
    "EmbeddingOutput",
    "Logprob",
    "Logprobs",
    "ModelRunnerOutput",
    "PromptLogprobs",
    "RequestOutput",
    "RerankResult",
    "RewardOutput",
    "ScoringOutput",
    "SpecDecodeStats",
]
