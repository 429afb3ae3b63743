"""The host arrays of one runner_v2 step on the device, in one transfer, as named fields.

Every step sends a few small index arrays (``idx_mapping``, ``num_scheduled_tokens``, the
rows that want logprobs, the staged row writes, the prompt-logprob plan): packed as int32
words into one pinned buffer and copied non-blocking, they cost one transfer and no sync.
:class:`StepUploads` is what the step reads back (views of that one device buffer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class StagedWrites:
    """Row writes staged on the host (``RequestStates.take_staged_writes``), on the device."""

    offsets: torch.Tensor  # [num_writes] int64, flat offsets into the request table
    cu_lens: torch.Tensor  # [num_writes + 1] int32, cumulative value counts
    values: torch.Tensor  # [num_values] int32


@dataclass(frozen=True)
class PromptLogprobUploads:
    """The prompt-logprob plan of a step (``runner_v2.prompt_logprobs``), on the device."""

    hidden_rows: torch.Tensor  # [num_prompt_rows] int64, rows of the step's hidden states
    target_flat: torch.Tensor  # [num_prompt_rows] int64, flat token-table index of each target
    num_logprobs: torch.Tensor  # [num_prompt_rows] int32, k of each row


@dataclass(frozen=True)
class SpecUploads:
    """The host plan of a speculative step (``runner_v2.spec_decode.SpecStepPlan``), on the device."""

    num_spec: torch.Tensor  # [n] int32, drafts scheduled per request
    cu_rows: torch.Tensor  # [n + 1] int32, target rows per request
    logits_indices: torch.Tensor  # [num_rows] int64, the step's token of each target row
    row_req: torch.Tensor  # [num_rows] int32, batch position of each target row
    decode_pos: torch.Tensor  # [m] int64, batch positions of the decoding requests
    decode_rows: torch.Tensor  # [m] int32, their table rows
    lp_rows: torch.Tensor  # [num_lp_rows] int64, target rows whose logprobs are asked
    lp_cells: torch.Tensor  # [num_lp_rows] int64, their cells in the [n, k + 1] output
    lp_k: torch.Tensor  # [num_lp_rows] int32, their k


SPEC_FIELDS = 9

#: Each array of the transfer starts at a multiple of 4 int32 words (16 bytes): Triton
#: specialises a pointer argument on 16-byte alignment, so a view whose start moved with the
#: lengths before it would compile another variant of its kernel in the middle of serving.
ALIGN_WORDS = 4


@dataclass(frozen=True)
class StepUploads:
    """One step's device copies of its host arrays.

    Attributes:
        idx_mapping: ``[num_reqs] int32`` batch position -> table row.
        num_scheduled: ``[num_reqs] int32``.
        logprob_positions: ``[num_lp] int64`` batch positions of the requests with logprobs.
        logprob_k: ``[num_lp] int32`` their k.
        writes: the staged row writes, or None when nothing was staged.
        prompt: the prompt-logprob plan, or None when no request scores its prompt.
        spec: the speculative plan, or None without speculation.
    """

    idx_mapping: torch.Tensor
    num_scheduled: torch.Tensor
    logprob_positions: torch.Tensor
    logprob_k: torch.Tensor
    writes: StagedWrites | None
    prompt: PromptLogprobUploads | None
    spec: SpecUploads | None = None


def upload_step(
    device: torch.device,
    *,
    rows: np.ndarray,
    num_scheduled: np.ndarray,
    logprob_positions: np.ndarray,
    logprob_k: np.ndarray,
    writes: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    prompt: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    spec: Sequence[np.ndarray] | None = None,
) -> StepUploads:
    """The step's host arrays on ``device`` in one non-blocking copy (see the module
    docstring); ``writes``, ``prompt`` and ``spec`` are ``(offsets, cu_lens, values)``,
    ``(hidden_rows, target_flat, num_logprobs)`` and :class:`SpecUploads`' fields in order."""
    arrays = [rows, num_scheduled, logprob_positions.astype(np.int64), logprob_k.astype(np.int32)]
    arrays += list(writes or ()) + list(prompt or ()) + list(spec or ())
    t = iter(to_device(arrays, device))
    base = [next(t) for _ in range(4)]
    staged = StagedWrites(next(t), next(t), next(t)) if writes is not None else None
    plan = PromptLogprobUploads(next(t), next(t), next(t)) if prompt is not None else None
    specs = SpecUploads(*(next(t) for _ in range(SPEC_FIELDS))) if spec is not None else None
    return StepUploads(base[0], base[1], base[2], base[3], writes=staged, prompt=plan, spec=specs)


_INT32 = np.dtype(np.int32)
#: The dtypes :func:`to_device` packs (whole int32 words), and their torch views.
_VIEW_DTYPES = {
    _INT32: torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Host arrays on the device in one transfer, without a sync, in order: packed as int32
    words (each array from a 16-byte boundary) into one pinned buffer, copied non-blocking (the
    caching host allocator keeps the pinned block until the copy has run), then viewed back
    per array with its dtype and shape.

    Raises:
        TypeError: an array whose dtype is not int32, int64, float32 or float64.
    """
    words, spans, offset = [], [], 0
    for a in arrays:
        arr = np.ascontiguousarray(a)  # (a 0-d array comes out 1-d: its shape is taken from a)
        if (
            arr.dtype not in _VIEW_DTYPES
        ):  # another dtype would come back reinterpreted as int32 words
            raise TypeError(
                f"to_device takes int32, int64, float32 and float64 arrays, got {arr.dtype}"
            )
        w = arr.reshape(-1).view(np.int32)
        if offset % ALIGN_WORDS:  # every view starts 16-byte aligned (see ALIGN_WORDS)
            pad = ALIGN_WORDS - offset % ALIGN_WORDS
            words.append(np.zeros(pad, np.int32))
            offset += pad
        spans.append((offset, len(w), arr.dtype, np.shape(a)))
        words.append(w)
        offset += len(w)
    # torch.from_numpy gives an empty array stride 0, which no int64 view accepts.
    host = torch.from_numpy(np.concatenate(words)) if offset else torch.zeros(0, dtype=torch.int32)
    if device.type == "cuda":
        pinned = torch.empty(host.shape, dtype=torch.int32, pin_memory=True)
        pinned.copy_(host)
        flat = pinned.to(device, non_blocking=True)
    else:
        flat = host.to(device)
    out = []
    for start, n, dtype, shape in spans:
        t = flat[start : start + n]
        if dtype != _INT32:
            t = t.view(_VIEW_DTYPES[dtype])
        out.append(t if len(shape) == 1 else t.view(shape))
    return out


__all__ = [
    "ALIGN_WORDS",
    "SPEC_FIELDS",
    "PromptLogprobUploads",
    "SpecUploads",
    "StagedWrites",
    "StepUploads",
    "to_device",
    "upload_step",
]
