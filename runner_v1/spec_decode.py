"""n-gram speculative decoding on the CPU history (prompt lookup decoding: Saxena 2023; vLLM
``method="ngram"``).

Propose: find the most recent earlier occurrence of the sequence's last ``n`` tokens (longest
``n`` first, from ``prompt_lookup_max`` down to ``prompt_lookup_min``) and propose the tokens
that followed it. Verify: the target model scores every draft position in one forward; drafts
are accepted while they equal the token the sampler draws at their position, and the first
mismatch (or the position after the last draft) contributes the sampler's own token. Because
the sampler is a deterministic function of the logits, the history and (seed, position), the
accepted output is exactly what non-speculative decoding produces, greedy or seeded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

#: The vLLM speculative methods this module implements (runner_v1's manifest lists them).
SPECULATIVE_METHODS = ("ngram",)


def propose_ngram(
    token_ids: np.ndarray,  # [num_tokens] int, the sequence so far
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    num_speculative_tokens: int,
) -> list[int]:
    """Drafts continuing ``token_ids`` (possibly fewer than asked, or none)."""
    num_tokens = int(token_ids.shape[0])
    for n in range(min(prompt_lookup_max, num_tokens - 1), prompt_lookup_min - 1, -1):
        suffix = token_ids[num_tokens - n :]
        # Windows over token_ids[:-1] start at 0..num_tokens-1-n: never the suffix itself.
        windows = sliding_window_view(token_ids[:-1], n)
        matches = np.flatnonzero((windows == suffix).all(axis=1))
        if matches.size:
            start = int(matches[-1]) + n
            drafts: list[int] = token_ids[start : start + num_speculative_tokens].tolist()
            return drafts
    return []


def accept_drafts(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a verification step yields: ``targets[:m + 1]`` where ``m`` drafts matched.

    Args:
        drafts: the ``k`` drafts that were scored.
        targets: the sampler's tokens at the ``k + 1`` positions.
    """
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} targets, got {len(targets)}")
    m = 0
    while m < len(drafts) and drafts[m] == targets[m]:
        m += 1
    return list(targets[: m + 1])


__all__ = ["SPECULATIVE_METHODS", "accept_drafts", "propose_ngram"]
