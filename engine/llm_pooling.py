"""The ``LLM`` facade's pooling tasks (vLLM's ``LLM.embed`` / ``classify`` / ``score`` /
``reward``, and ``rerank`` ordering documents as vLLM's ``/rerank`` endpoint does); the
methods of :class:`engine.llm.LLM` call these.

Each task is checked once against the model (:class:`EngineConfigError` naming the task and
the model when it does not serve it), then one pooling request is queued per input; an input
that cannot be served (too long, empty, ...) comes back with ``error`` set while the others
finish. The runners return raw pooled vectors (float32 embeddings, or head logits); the
activations are applied here, in double precision over those float32 values:

- ``classify``: ``probs = softmax(logits)``; ``sigmoid(logits)`` for a one-label head (vLLM's
  convention, and sentence-transformers' for one label);
- ``score``: the one logit under sentence-transformers' ``CrossEncoder`` default activation:
  the config's ``sbert_ce_default_activation_function`` (ms-marco cross-encoders name
  Identity: the raw logit), else sigmoid;
- ``reward``: the raw head outputs (no activation).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, cast

from turnout.engine.errors import EngineConfigError, InvalidRequestError
from turnout.engine.outputs import (
    ClassificationOutput,
    EmbeddingOutput,
    RerankResult,
    RewardOutput,
    ScoringOutput,
)
from turnout.engine.pooling_params import PoolingParams

if TYPE_CHECKING:
    from turnout.engine.llm import LLM, Prompt

#: What each task needs, for the error when a model does not serve it.
TASK_MODELS = {
    "embed": "an embedding model (BertModel)",
    "classify": "a sequence classifier (BertForSequenceClassification, LlamaForSequenceClassification)",
    "score": "a cross-encoder (BertForSequenceClassification with one label)",
    "reward": "a reward model (LlamaForSequenceClassification)",
}


class Encoded(NamedTuple):
    """One input ready to queue: token ids and (pairs only) token type ids, or its error."""

    token_ids: list[int]
    token_type_ids: tuple[int, ...] | None = None
    error: InvalidRequestError | None = None


class Pooled(NamedTuple):
    """One input's result: its request id, tokens, the pooled vector or the error."""

    request_id: str
    token_ids: list[int]
    token_type_ids: tuple[int, ...] | None
    vector: list[float] | None
    error: str | None


def embed(llm: LLM, texts: Prompt | Sequence[Prompt]) -> list[EmbeddingOutput]:
    batch = checked_batch(llm, "embed", texts)
    done = run_pooling(llm, "embed", [encode_single(llm, p) for p in batch])
    return [
        EmbeddingOutput(r.request_id, _text(p), r.token_ids, r.vector, r.error)
        for p, r in zip(batch, done, strict=True)
    ]


def classify(llm: LLM, prompts: Prompt | Sequence[Prompt]) -> list[ClassificationOutput]:
    batch = checked_batch(llm, "classify", prompts)
    done = run_pooling(llm, "classify", [encode_single(llm, p) for p in batch])
    return [
        ClassificationOutput(
            r.request_id,
            _text(p),
            r.token_ids,
            r.vector,
            None if r.vector is None else probabilities(r.vector),
            r.error,
        )
        for p, r in zip(batch, done, strict=True)
    ]


def reward(llm: LLM, prompts: Prompt | Sequence[Prompt]) -> list[RewardOutput]:
    batch = checked_batch(llm, "reward", prompts)
    done = run_pooling(llm, "reward", [encode_single(llm, p) for p in batch])
    return [
        RewardOutput(r.request_id, _text(p), r.token_ids, r.vector, r.error)
        for p, r in zip(batch, done, strict=True)
    ]


def score(llm: LLM, query: Prompt, documents: Prompt | Sequence[Prompt]) -> list[ScoringOutput]:
    docs = checked_batch(llm, "score", documents)
    if not docs:
        raise InvalidRequestError("score: the document list is empty: give at least one document")
    if not _is_single_prompt(query):
        raise InvalidRequestError(
            f"score: the query is one text or one list of token ids, got {query!r:.80}"
        )
    done = run_pooling(llm, "score", [encode_pair(llm, query, d, i) for i, d in enumerate(docs)])
    sigmoid = llm.model_config.classifier.score_activation == "sigmoid"
    return [
        ScoringOutput(
            r.request_id,
            _text(d),
            r.token_ids,
            list(r.token_type_ids or ()),
            None if r.vector is None else (_sigmoid(r.vector[0]) if sigmoid else r.vector[0]),
            r.error,
        )
        for d, r in zip(docs, done, strict=True)
    ]


def _is_single_prompt(prompt: object) -> bool:
    # one text, or one flat list of token ids (Python or numpy ints): not a batch of them
    if isinstance(prompt, str):
        return True
    if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence):
        return False
    return len(prompt) > 0 and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt
    )


def rerank(
    llm: LLM, query: Prompt, documents: Prompt | Sequence[Prompt], top_n: int | None
) -> list[RerankResult]:
    if top_n is not None and (
        not isinstance(top_n, numbers.Integral) or isinstance(top_n, bool) or top_n < 1
    ):
        raise ValueError(f"rerank: top_n must be a positive int or None, got {top_n!r}")
    top_n = None if top_n is None else int(top_n)
    docs = as_batch(documents)
    scores = score(llm, query, docs)
    ranked = sorted(
        (i for i, s in enumerate(scores) if s.score is not None),
        key=lambda i: -(scores[i].score or 0.0),
    )  # stable: ties keep document order
    failed = [
        RerankResult(i, docs[i], None, s.error) for i, s in enumerate(scores) if s.score is None
    ]
    return [RerankResult(i, docs[i], scores[i].score) for i in ranked[:top_n]] + failed


# ---- shared steps ------------------------------------------------------------------------
def checked_batch(llm: LLM, task: str, prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """``prompts`` as a list, once the model is known to serve ``task``.

    Raises:
        EngineConfigError: it does not (naming the task, the model and what it serves).
    """
    served = llm.config.pooling_tasks
    if task not in served:
        model, arch = llm.config.model, llm.model_config.architecture
        if not served:
            raise EngineConfigError(
                f"{model} is not a pooling model ({arch} generates text): it does not "
                f"serve the {task!r} task; use generate()"
            )
        raise EngineConfigError(
            f"{model} ({arch}) does not serve the {task!r} task, which needs "
            f"{TASK_MODELS[task]}; it serves: {', '.join(served)}"
        )
    return as_batch(prompts)


def encode_single(llm: LLM, prompt: Prompt) -> Encoded:
    tokens = llm._encode(prompt, add_special_tokens=True)
    return Encoded([], error=tokens) if isinstance(tokens, InvalidRequestError) else Encoded(tokens)


def encode_pair(llm: LLM, query: Prompt, document: Prompt, index: int) -> Encoded:
    """Text as a tokenizer pair; token ids joined as given (the caller's special tokens)."""
    if isinstance(query, str) != isinstance(document, str):
        return Encoded(
            [],
            error=InvalidRequestError(
                f"document {index}: the query and the document must both be text or both token ids"
            ),
        )
    if isinstance(query, str):
        if llm.tokenizer is None:
            return Encoded(
                [],
                error=InvalidRequestError(
                    f"{llm.config.model} has no tokenizer: pass token ids instead of text"
                ),
            )
        ids, types = llm.tokenizer.encode_pair(query, document)
        return Encoded(ids, tuple(types))
    q, d = (
        llm._encode(query, add_special_tokens=False),
        llm._encode(document, add_special_tokens=False),
    )
    for part in (q, d):
        if isinstance(part, InvalidRequestError):
            return Encoded([], error=part)
    assert isinstance(q, list) and isinstance(d, list)
    return Encoded([*q, *d], (0,) * len(q) + (1,) * len(d))


def run_pooling(llm: LLM, task: str, items: list[Encoded]) -> list[Pooled]:
    """Queue each input as a pooling request of ``task`` and run them all; one result per
    input, in order (a rejected input's error names it: ``document i`` for pairs)."""
    results: dict[str, Pooled] = {}
    ids: list[str] = []
    with llm._abort_all_on_failure():
        for index, item in enumerate(items):
            req_id = llm._new_id()
            ids.append(req_id)
            try:
                if item.error is not None:
                    raise item.error
                llm._queue(
                    req_id,
                    list(item.token_ids),
                    pooling_params=PoolingParams(task, item.token_type_ids),
                )
            except InvalidRequestError as exc:
                error = (
                    f"document {index}: {exc}"
                    if task == "score" and item.error is None
                    else str(exc)
                )
                results[req_id] = Pooled(
                    req_id, list(item.token_ids), item.token_type_ids, None, error
                )
        finished = llm._run_until_done()
    types = dict(zip(ids, (item.token_type_ids for item in items), strict=True))
    for req in finished:
        results[req.req_id] = Pooled(
            req.req_id, req.prompt_token_ids, types[req.req_id], req.pooled_output, req.error
        )
    return [results[i] for i in ids]


def probabilities(logits: Sequence[float]) -> list[float]:
    """``softmax(logits)``, or ``sigmoid`` of a single logit."""
    if len(logits) == 1:
        return [_sigmoid(logits[0])]
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One text, one list of token ids, or a sequence of either, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Mapping):  # iterating a dict would score its keys
        raise InvalidRequestError(
            f"expected a text, a list of token ids or a list of those, got a {type(prompts).__name__}"
        )
    items = list(prompts)
    if items and all(isinstance(t, numbers.Integral) for t in items):
        return [cast("list[int]", items)]  # one prompt of token ids (Python or numpy ints)
    return cast("list[Prompt]", items)


def _text(prompt: Prompt | None) -> str | None:
    return prompt if isinstance(prompt, str) else None


__all__ = [
    "TASK_MODELS",
    "as_batch",
    "classify",
    "embed",
    "probabilities",
    "rerank",
    "reward",
    "score",
]
