"""runner_v1's sampler: ``docs/sampling.md`` steps 2-9 in torch, one row per token to sample.

A row is one (request, position) pair: a plain decode has one row per request; a request
verifying ``k`` drafts has ``k + 1`` rows, row ``j`` scoring position ``num_tokens + j`` with
the drafts before it counted as output (so penalties and ``min_tokens`` see the same history a
non-speculative run would). Logprobs (step 1) are taken from the raw logits by the caller.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from turnout.kernels.gumbel_noise import gumbel_noise_ref

GREEDY_EPS = 1e-5  # docs/sampling.md step 5


@dataclass
class SamplingMetadata:
    """Per-row sampling inputs (``N`` rows).

    Attributes:
        temperature: ``[N] float32``.
        top_k: ``[N] int64``; ``<= 0`` keeps every token.
        top_p: ``[N] float32``; 1 keeps every token.
        min_p: ``[N] float32`` or ``None`` when no row has ``min_p > 0``; 0 keeps every token.
        seeds: ``[N] int64``.
        positions: ``[N] int64``, index in its sequence of the token each row samples.
        output_token_ids: per row, the output so far (drafts before the row included).
        prompt_token_ids: per row, the prompt (for the repetition penalty and processors).
        presence_penalty, frequency_penalty, repetition_penalty: ``[N] float32`` or ``None``
            when no row has any penalty.
        masked_token_ids: per row, token ids forced to ``-inf`` (``min_tokens``), or ``()``.
        logits_processors: per row, the request's processors, or ``()``.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor
    positions: torch.Tensor
    output_token_ids: Sequence[Sequence[int]]
    prompt_token_ids: Sequence[Sequence[int]]
    presence_penalty: torch.Tensor | None = None
    frequency_penalty: torch.Tensor | None = None
    repetition_penalty: torch.Tensor | None = None
    masked_token_ids: Sequence[Sequence[int]] = ()
    logits_processors: Sequence[Sequence[Callable[..., Any]]] = ()
    min_p: torch.Tensor | None = None


def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> dict[int, str]:
    """Step 2: each row's processors in order, in place. Returns ``row -> error message`` for
    rows whose processor raised or returned a bad row (those rows are left as they were)."""
    errors: dict[int, str] = {}
    for row, processors in enumerate(md.logits_processors):
        if not processors:
            continue
        out_ids, prompt_ids = list(md.output_token_ids[row]), list(md.prompt_token_ids[row])
        current = logits[row].clone()
        try:
            for fn in processors:
                args = (prompt_ids, out_ids, current) if _arity(fn) == 3 else (out_ids, current)
                current = fn(*args)
                if not isinstance(current, torch.Tensor) or current.shape != logits[row].shape:
                    raise TypeError(f"it must return a tensor of shape {tuple(logits[row].shape)}")
        except Exception as exc:  # a request's own code fails that request only
            name = getattr(fn, "__name__", repr(fn))
            errors[row] = f"logits processor {name} failed: {type(exc).__name__}: {exc}"
            continue
        logits[row] = current.to(logits.dtype)
    return errors


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return 3 if len(positional) >= 3 else 2


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Step 3 (vLLM's definitions), in place: repetition over prompt + output, frequency and
    presence over the output."""
    if md.repetition_penalty is None or md.presence_penalty is None or md.frequency_penalty is None:
        return
    num_rows, vocab_size = logits.shape
    counts = _token_counts(md.output_token_ids, num_rows, vocab_size, logits.device)
    prompt_seen = _token_counts(md.prompt_token_ids, num_rows, vocab_size, logits.device) > 0
    seen = prompt_seen | (counts > 0)
    r = md.repetition_penalty.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / r, logits * r)
    logits.copy_(torch.where(seen, penalised, logits))
    logits -= md.frequency_penalty.unsqueeze(1) * counts
    logits -= md.presence_penalty.unsqueeze(1) * (counts > 0).to(logits.dtype)


def _token_counts(
    token_ids: Sequence[Sequence[int]], num_rows: int, vocab_size: int, device: torch.device
) -> torch.Tensor:
    # [num_rows, vocab_size] float32 occurrence counts; padding goes to an extra column.
    width = max((len(t) for t in token_ids), default=0)
    padded = torch.full((num_rows, max(width, 1)), vocab_size, dtype=torch.int64)
    for row, ids in enumerate(token_ids):
        if len(ids):
            padded[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.int64)
    counts = torch.zeros(num_rows, vocab_size + 1, dtype=torch.float32)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))
    return counts[:, :vocab_size].to(device)


def apply_masks(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Step 4: ``min_tokens`` — listed ids get ``-inf``, in place."""
    for row, ids in enumerate(md.masked_token_ids):
        if ids:
            logits[row, list(ids)] = float("-inf")


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Step 6's min-p on temperature-scaled logits ``[N, vocab_size]`` with ``min_p`` ``[N]``
    float32: a token whose probability is below ``min_p`` times its row's largest gets
    ``-inf``. Returns a new tensor (or ``logits`` when no row has ``min_p > 0``).

    vLLM's ``MinPLogitsProcessor.apply`` (``vllm/v1/sample/logits_processor/builtin.py``), run
    by ``Sampler.sample`` (``vllm/v1/sample/sampler.py``) after temperature and before top-k and
    top-p. A row with ``min_p`` 0 keeps every token; the most likely token(s) always stay.
    """
    if not bool((min_p > 0).any()):
        return logits
    probs = logits.softmax(dim=-1)
    max_prob = probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < min_p.unsqueeze(1) * max_prob, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Steps 7-8 on temperature-scaled logits; returns a new tensor with dropped tokens at
    ``-inf``. Boundary ties are kept in both."""
    vocab_size = logits.shape[1]
    use_k, use_p = bool((top_k > 0).any()), bool((top_p < 1).any())
    if not use_k and not use_p:
        return logits
    if use_k:
        k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=vocab_size)
        sorted_logits = logits.sort(dim=-1, descending=True).values
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if use_p:
        probs = logits.softmax(dim=-1)
        sorted_probs = probs.sort(dim=-1, descending=True).values
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ahead
        num_keep = (before < top_p.unsqueeze(1)).sum(dim=-1).clamp(min=1)
        threshold = sorted_probs.gather(1, (num_keep - 1).unsqueeze(1))
        drop = (probs < threshold) & (top_p < 1).unsqueeze(1)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:  # [N] int64
    """Steps 5-9 on processed logits ``[N, vocab_size] float32`` (not modified): temperature,
    then min-p, then top-k and top-p, as vLLM's ``Sampler.sample``."""
    greedy_rows = md.temperature < GREEDY_EPS
    greedy = logits.argmax(dim=-1)  # ties: the first (lowest) id
    random_rows = (~greedy_rows).nonzero().squeeze(1)
    if random_rows.numel() == 0:
        return greedy
    x = logits[random_rows] / md.temperature[random_rows].unsqueeze(1)
    if md.min_p is not None:
        x = apply_min_p(x, md.min_p[random_rows])
    x = apply_top_k_top_p(x, md.top_k[random_rows], md.top_p[random_rows])
    noise = gumbel_noise_ref(md.seeds[random_rows], md.positions[random_rows], logits.shape[1])
    drawn = (x + noise.to(x.device)).argmax(dim=-1)
    return greedy.index_copy(0, random_rows, drawn)


__all__ = [
    "GREEDY_EPS",
    "SamplingMetadata",
    "apply_logits_processors",
    "apply_masks",
    "apply_min_p",
    "apply_penalties",
    "apply_top_k_top_p",
    "sample",
]
