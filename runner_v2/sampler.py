"""runner_v2's sampler: docs/sampling.md over the request table, entirely on the device.

Per step: penalty counts (only when a scheduled request has a penalty), one Gumbel-max launch
for every request (greedy, temperature, min-p, top-k, top-p, min_tokens and the seeded noise
shared with runner_v1), then the logprobs of the requests that asked, from the raw logits. Outputs are
fresh tensors each step: the asynchronous copy of step N still reads them while step N+1 runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from turnout.kernels.gumbel_sample import SamplingTables, gumbel_sample
from turnout.kernels.penalties import build_penalty_counts
from turnout.kernels.sampling_probs import compute_probs
from turnout.kernels.topk_logprobs import topk_logprobs

#: Elements of any vocabulary-wide temporary of the logprob paths (4 MiB of float32), as
#: runner_v1's ``WORKING_SET_ELEMS``: logits chunks and ``[rows, 1 + k]`` results.
WORKING_SET_ELEMS = 1 << 20


@dataclass(frozen=True)
class LogprobsTensors:
    """Logprobs of ``n`` rows in the engine's compact layout, on the device.

    Column 0 is the sampled (or actual prompt) token, columns ``1..k`` the ``k`` most likely
    tokens of that row (``k`` varies per row; the width is the step's largest ``k`` + 1).
    """

    token_ids: torch.Tensor  # [n, 1 + max_k] int32
    logprobs: torch.Tensor  # [n, 1 + max_k] float32
    ranks: torch.Tensor  # [n] int32


def sample(
    logits: torch.Tensor,  # [num_reqs, vocab_size] float32, raw
    idx_mapping: torch.Tensor,  # [num_reqs] int32
    seq_lens: torch.Tensor,  # [>= num_reqs] int32: position of each sampled token
    tables: SamplingTables,
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32 request table
    use_penalties: bool,  # a scheduled request has a penalty (known on the host)
) -> torch.Tensor:  # [num_reqs] int32, a fresh tensor
    """Sample one token per request (docs/sampling.md steps 3-9)."""
    return sample_with_probs(
        logits, idx_mapping, seq_lens, tables, token_ids, use_penalties, False
    )[0]


def sample_with_probs(
    logits: torch.Tensor,  # [num_rows, vocab_size] float32, raw
    idx_mapping: torch.Tensor,  # [num_rows] int32: table row of each logits row
    positions: torch.Tensor,  # [>= num_rows] int32: position of the token each row samples
    tables: SamplingTables,
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32 request table
    use_penalties: bool,  # a row has a penalty (known on the host)
    want_probs: bool,  # a row samples (temperature > 0): speculative decoding needs p
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [num_rows] int32, [num_rows, vocab_size] float32
    """One token per row and, when asked, each sampled row's processed distribution (the
    distribution the token is drawn from; ``kernels/sampling_probs.py``). Speculative steps have
    several rows per request (one per verified position): the penalty counts of each row see
    the drafts before it in the token table."""
    num_rows, vocab_size = logits.shape
    counts = None
    if use_penalties:  # skipped entirely otherwise: no [num_rows, vocab] scratch
        counts = torch.zeros(num_rows, vocab_size, dtype=torch.int32, device=logits.device)
        build_penalty_counts(
            idx_mapping,
            positions,
            token_ids,
            tables.num_prompt_tokens,
            tables.repetition_penalty,
            tables.frequency_penalty,
            tables.presence_penalty,
            counts,
        )
    sampled = torch.empty(num_rows, dtype=torch.int32, device=logits.device)
    gumbel_sample(logits, idx_mapping, positions, tables, counts, sampled)
    probs = None
    if want_probs:
        probs = torch.empty(num_rows, vocab_size, dtype=torch.float32, device=logits.device)
        compute_probs(logits, idx_mapping, positions, tables, counts, probs)
    return sampled, probs


def compute_logprobs(
    get_logits: Callable[[int, int], torch.Tensor],  # (a, b) -> [b - a, vocab_size] float32, raw
    token_ids: torch.Tensor,  # [n] int32: column-0 token of each row
    num_logprobs: torch.Tensor,  # [n] int32: k per row
    max_k: int,  # the largest k (host int; sizes the output)
    vocab_size: int,
) -> list[LogprobsTensors]:  # row chunks, in order
    """docs/sampling.md step 1 for ``n`` rows, in chunks of rows such that no vocabulary-wide
    tensor (the chunk's logits, its ``[rows, 1 + k]`` result with ``k`` up to the vocabulary)
    exceeds ``WORKING_SET_ELEMS`` elements; ``get_logits`` makes each chunk's logits on demand
    (prompt logprobs apply the LM head per chunk)."""
    n = token_ids.shape[0]
    rows = max(1, WORKING_SET_ELEMS // max(vocab_size, max_k + 1))
    chunks = []
    for a in range(0, n, rows):
        b = min(n, a + rows)
        logits = get_logits(a, b)
        device = logits.device
        ids = torch.empty(b - a, 1 + max_k, dtype=torch.int32, device=device)
        lps = torch.empty(b - a, 1 + max_k, dtype=torch.float32, device=device)
        ranks = torch.empty(b - a, dtype=torch.int32, device=device)
        token_lps = torch.empty(b - a, dtype=torch.float32, device=device)
        ids[:, 0] = token_ids[a:b]
        topk_logprobs(
            logits, token_ids[a:b], num_logprobs[a:b], ids[:, 1:], lps[:, 1:], token_lps, ranks
        )
        lps[:, 0] = token_lps
        chunks.append(LogprobsTensors(ids, lps, ranks))
    return chunks


def compute_prompt_logprobs(
    hidden: torch.Tensor,  # [num_tokens, hidden_size], the step's hidden states
    compute_logits: Callable[[torch.Tensor], torch.Tensor],  # [c, hidden] -> [c, vocab] float32
    token_ids: torch.Tensor,  # [max_num_seqs, max_model_len] int32 request table
    hidden_rows: torch.Tensor,  # [total] int64: token index in the step of each position
    target_flat: torch.Tensor,  # [total] int64: flat table index of each target token
    num_logprobs: torch.Tensor,  # [total] int32: k per position
    max_k: int,
    vocab_size: int,
) -> list[LogprobsTensors]:
    """Prompt logprobs in bounded chunks: the LM head runs per chunk of positions, so no
    ``[prompt positions, vocab_size]`` tensor exists whatever the prompt length
    (docs/architecture.md §5.5: buffers follow the work). Targets come from the device token
    table."""
    targets = token_ids.view(-1).index_select(0, target_flat)
    return compute_logprobs(
        lambda a, b: compute_logits(hidden.index_select(0, hidden_rows[a:b])),
        targets,
        num_logprobs,
        max_k,
        vocab_size,
    )


__all__ = [
    "WORKING_SET_ELEMS",
    "LogprobsTensors",
    "compute_logprobs",
    "compute_prompt_logprobs",
    "sample",
    "sample_with_probs",
]
