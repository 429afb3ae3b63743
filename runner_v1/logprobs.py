"""Logprobs with a bounded working set (docs/architecture.md §5.5: buffers follow the work, not
the vocab).

Rows are processed in slices of at most ``max(1, WORKING_SET_ELEMS // vocab_size)`` so that
``k`` up to the whole vocabulary never needs more than about ``WORKING_SET_ELEMS`` elements per
temporary tensor, whatever the number of positions; only the result (``[n, 1 + k]``, what was
asked for) grows with ``n``. Top-k order: most likely first, ties to the lower token id
(``docs/sampling.md`` step 1); rank counts tokens with a logprob ``>=`` the token's own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from turnout.engine.outputs import Logprobs

#: Elements per temporary ``[rows, vocab_size]`` tensor (4 MiB of float32).
WORKING_SET_ELEMS = 1 << 20


def rows_per_slice(vocab_size: int, working_set_elems: int = WORKING_SET_ELEMS) -> int:
    return max(1, working_set_elems // vocab_size)


def compute_logprobs(
    get_logits: Callable[[int, int], torch.Tensor],  # (start, stop) -> [stop-start, V] float32
    token_ids: torch.Tensor,  # [n] int64, the column-0 token of each row
    num_logprobs: int,
    vocab_size: int,
    working_set_elems: int = WORKING_SET_ELEMS,
) -> Logprobs:
    """Logprobs of ``n`` rows whose raw logits ``get_logits`` produces slice by slice.

    ``get_logits`` may compute the logits on demand (prompt logprobs apply the LM head per
    slice) or slice an existing tensor.
    """
    n = int(token_ids.shape[0])
    out_ids = np.empty((n, num_logprobs + 1), np.int32)
    out_lps = np.empty((n, num_logprobs + 1), np.float32)
    ranks = np.empty(n, np.int32)
    step = rows_per_slice(vocab_size, working_set_elems)
    for start in range(0, n, step):
        stop = min(n, start + step)
        lps = torch.log_softmax(get_logits(start, stop).float(), dim=-1)
        tok = token_ids[start:stop].to(lps.device).unsqueeze(1)
        tok_lp = lps.gather(1, tok)
        ranks[start:stop] = (lps >= tok_lp).sum(dim=-1).cpu().numpy()
        out_ids[start:stop, 0] = tok.squeeze(1).cpu().numpy()
        out_lps[start:stop, 0] = tok_lp.squeeze(1).cpu().numpy()
        if num_logprobs:
            top_ids, top_lps = top_k_ties_low_id(lps, num_logprobs)
            out_ids[start:stop, 1:] = top_ids.cpu().numpy()
            out_lps[start:stop, 1:] = top_lps.cpu().numpy()
        del lps
    return Logprobs(out_ids, out_lps, ranks)


def top_k_ties_low_id(
    lps: torch.Tensor,  # [r, V] float32
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # [r, k] int64 ids, [r, k] float32 values
    """The ``k`` largest entries of each row, largest first, equal values by ascending id.

    ``torch.topk`` picks an arbitrary subset among values tied at the k-th place; rows where
    such a tie crosses the boundary are redone with a stable sort (rare with real logits).
    """
    vocab_size = lps.shape[1]
    k = min(k, vocab_size)
    if k == vocab_size:
        values, ids = torch.sort(lps, dim=-1, descending=True, stable=True)
        return ids, values
    values, ids = torch.topk(lps, k, dim=-1)
    kth = values[:, -1:]
    ambiguous = ((lps == kth).sum(dim=-1) != (values == kth).sum(dim=-1)).nonzero().squeeze(1)
    if ambiguous.numel():
        v, i = torch.sort(lps[ambiguous], dim=-1, descending=True, stable=True)
        values[ambiguous], ids[ambiguous] = v[:, :k], i[:, :k]
    # Within the selection, order equal values by id: sort by id, then stably by value.
    by_id = torch.sort(ids, dim=-1).indices
    ids, values = ids.gather(1, by_id), values.gather(1, by_id)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return ids.gather(1, order), values.gather(1, order)


__all__ = ["WORKING_SET_ELEMS", "compute_logprobs", "rows_per_slice", "top_k_ties_low_id"]
