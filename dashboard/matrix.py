"""The capability matrix as a grid: every cell of the pack's closed domains decided by the
oracle (``enumerate_matrix``) under the current canaries, summarised as family x one dimension
(share of cells per runner). Computed once per canary snapshot and cached."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from oracle import CanarySnapshot, Pack


@dataclass(frozen=True)
class MatrixSummary:
    num_cells: int
    dimensions: list[str]
    # dimension → family → value (as text) → runner ("v1" | "v2" | "none") → cells
    grid: dict[str, dict[str, dict[str, dict[str, int]]]]
    values: dict[str, list[str]]  # dimension → values in domain order


def _parts(cell: Any) -> tuple[Any, Any]:
    """(config, decision) of a matrix cell."""
    if isinstance(cell, tuple):
        return cell[0], cell[1]
    return cell.config, cell.decision


def summarise(pack: Pack, canaries: CanarySnapshot | None) -> MatrixSummary:
    from oracle import enumerate_matrix

    dims = [d for d, dom in pack.domains.items() if dom is not None and 1 < len(dom) <= 16]
    grid: dict[str, dict[str, dict[str, Counter[str]]]] = {
        d: defaultdict(lambda: defaultdict(Counter)) for d in dims}
    num = 0
    for cell in enumerate_matrix(pack, canaries):
        config, decision = _parts(cell)
        num += 1
        family = decision.family or "unknown"
        runner = decision.runner or "none"
        for d in dims:
            grid[d][family][str(getattr(config, d, None))][runner] += 1
    values = {d: [str(v) for v in pack.domains[d] or ()] for d in dims}
    plain = {d: {f: {v: dict(c) for v, c in by_v.items()} for f, by_v in sorted(by_f.items())}
             for d, by_f in grid.items()}
    return MatrixSummary(num, dims, plain, values)


class MatrixCache:
    """One summary per canary snapshot (the matrix changes only when the canaries do)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: str | None = None
        self._value: MatrixSummary | None = None

    def get(self, pack: Pack, canaries: CanarySnapshot, etag: str) -> MatrixSummary:
        with self._lock:
            if self._key != etag or self._value is None:
                self._value = summarise(pack, canaries)
                self._key = etag
            return self._value
