"""``PoolingParams``: what a pooling request asks for (vLLM's name), in place of sampling
parameters. Torch-free.

The pooling tasks are vLLM's: ``embed`` (a normalised sentence embedding), ``classify``
(sequence-classification logits), ``score`` (a cross-encoder's relevance logit of a
``(query, document)`` pair, tokenized as a pair with segment ids) and ``reward`` (a reward
model's head at the last token). Which tasks a model serves follows from its architecture
(``EngineConfig.pooling_tasks``; ``engine/model/pooling_config.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from turnout.engine.errors import InvalidRequestError

POOLING_TASKS = ("embed", "classify", "score", "reward")


@dataclass(frozen=True)
class PoolingParams:
    """Parameters of one pooling request.

    Attributes:
        task: one of :data:`POOLING_TASKS`.
        token_type_ids: for ``score`` only, the segment id of each prompt token: 0 for the
            first segment (``[CLS] query [SEP]``), 1 for the second (``document [SEP]``), as
            HF's pair tokenization gives them; ``None``: all 0.
    """

    task: str = "embed"
    token_type_ids: tuple[int, ...] | None = None

    def verify(
        self, req_id: str, num_prompt_tokens: int, served: Sequence[str], model: str
    ) -> None:
        """Check the task against the ``served`` tasks and the token types against the prompt.

        Raises:
            InvalidRequestError: an unknown or unserved task, or token types that are not one
                0/1 per prompt token (naming the request).
        """
        if self.task not in POOLING_TASKS:
            raise InvalidRequestError(
                f"request {req_id!r}: unknown pooling task {self.task!r}; "
                f"known: {', '.join(POOLING_TASKS)}"
            )
        if self.task not in served:
            raise InvalidRequestError(
                f"request {req_id!r}: {model} does not serve the {self.task!r} "
                f"task (it serves: {', '.join(served) or 'no pooling task'})"
            )
        types = self.token_type_ids
        if types is None:
            return
        if self.task != "score":
            raise InvalidRequestError(
                f"request {req_id!r}: token_type_ids are for the 'score' task "
                f"(pairs), not {self.task!r}"
            )
        if len(types) != num_prompt_tokens or any(
            t not in (0, 1) or isinstance(t, bool) for t in types
        ):
            raise InvalidRequestError(
                f"request {req_id!r}: token_type_ids must be one 0 or 1 per prompt "
                f"token ({num_prompt_tokens}), got {len(types)} values"
            )


__all__ = ["POOLING_TASKS", "PoolingParams"]
