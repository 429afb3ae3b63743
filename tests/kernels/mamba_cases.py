"""Seeded varlen batches over per-request states, shared by the Mamba kernel tests
(``test_causal_conv1d.py``, ``test_selective_scan.py``). Inputs are drawn on the CPU and live on
``DEVICE``: CUDA where there is one (compiled kernels), else the CPU (the interpreter)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class StateBatch:
    """The index arrays of one step: request ``i`` has ``q_lens[i]`` tokens and state slot
    ``state_indices[i]`` (a shuffled, non-identity choice among ``num_slots``)."""

    q_lens: list[int]
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    state_indices: torch.Tensor  # [num_reqs] int32
    has_initial_state: torch.Tensor  # [num_reqs] bool
    num_slots: int

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    def spans(self) -> list[slice]:
        starts = self.query_start_loc.tolist()
        return [slice(starts[i], starts[i + 1]) for i in range(len(self.q_lens))]


def state_batch(
    q_lens: list[int],
    *,
    seed: int,
    init: list[bool] | None = None,
    slots: list[int] | None = None,
    num_slots: int | None = None,
    device: str = DEVICE,
) -> StateBatch:
    """Slots drawn without replacement (unless given); ``init`` drawn at random (unless given)."""
    g = torch.Generator().manual_seed(seed)
    n = len(q_lens)
    num_slots = num_slots or n + 3
    if slots is None:
        slots = torch.randperm(num_slots, generator=g)[:n].tolist()
    if init is None:
        init = (torch.rand(n, generator=g) < 0.5).tolist()
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    return StateBatch(
        q_lens=list(q_lens),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
        has_initial_state=torch.tensor(init, dtype=torch.bool, device=device),
        num_slots=num_slots,
    )


def random_q_lens(seed: int, width: int, max_len: int = 30) -> list[int]:
    """3 to 6 ragged lengths: always one decode-like 1 and one shorter than ``width - 1``
    (where the new conv state still holds stored inputs), the rest up to ``max_len``."""
    g = torch.Generator().manual_seed(1000 + seed)
    n = int(torch.randint(3, 7, (1,), generator=g))
    lens = [1, max(1, width - 2), *torch.randint(1, max_len + 1, (n - 2,), generator=g).tolist()]
    return [lens[i] for i in torch.randperm(n, generator=g).tolist()]


def randn(
    *shape: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    scale: float = 1.0,
    device: str = DEVICE,
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def split_lengths(length: int, num_chunks: int, seed: int) -> list[int]:
    """``length`` cut into ``num_chunks`` positive pieces at random points (fewer when short)."""
    g = torch.Generator().manual_seed(2000 + seed)
    num_chunks = min(num_chunks, length)
    cuts = sorted(torch.randperm(length - 1, generator=g)[: num_chunks - 1].add(1).tolist())
    bounds = [0, *cuts, length]
    return [b - a for a, b in itertools.pairwise(bounds)]


Step = list[tuple[int, int, int]]  # (request, offset of the piece in the request, its length)


def chunk_steps(q_lens: list[int], num_chunks: int, seed: int) -> list[Step]:
    """Chunked prefill: each request cut into up to ``num_chunks`` pieces; step ``k`` schedules
    piece ``k`` of every request that has one."""
    pieces = [split_lengths(n, num_chunks, seed + i) for i, n in enumerate(q_lens)]
    return [
        [(i, sum(p[:k]), p[k]) for i, p in enumerate(pieces) if k < len(p)]
        for k in range(max(len(p) for p in pieces))
    ]


def whole_step(q_lens: list[int]) -> list[Step]:
    """Every request in one piece, from a zero state."""
    return [[(i, 0, n) for i, n in enumerate(q_lens)]]


def run_in_steps(
    fn,
    per_token: dict[str, torch.Tensor],
    q_lens: list[int],
    slots: list[int],  # type: ignore[no-untyped-def]
    steps: list[Step],
    **fixed: object,
) -> torch.Tensor:
    """Run ``fn`` (a varlen launcher or reference) step after step: ``per_token`` tensors hold
    the requests' whole sequences packed (request after request); each step gathers its
    pieces' rows, continues from the stored state for pieces past a request's start, and its
    outputs are scattered back to the packed order. Returns the packed outputs."""
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    out: torch.Tensor | None = None
    for step in steps:
        rows = torch.tensor(
            [starts[i] + off + j for i, off, n in step for j in range(n)], dtype=torch.long
        )
        first = next(iter(per_token.values()))
        b = state_batch(
            [n for _, _, n in step],
            seed=0,
            init=[off > 0 for _, off, _ in step],
            slots=[slots[i] for i, _, _ in step],
            device=str(first.device),
        )
        res = fn(
            **{k: v[rows.to(v.device)] for k, v in per_token.items()},
            **fixed,
            query_start_loc=b.query_start_loc,
            state_indices=b.state_indices,
            has_initial_state=b.has_initial_state,
        )
        if out is None:
            out = torch.empty((starts[-1], *res.shape[1:]), dtype=res.dtype, device=res.device)
        out[rows.to(res.device)] = res
    assert out is not None
    return out
