"""The capability matrix as a grid: every cell of the pack's closed domains decided by the
oracle (``enumerate_matrix``: architecture x runner pin x scenario) under the current canaries,
summarised per pin as family (rows) x scenario (columns) → cells per runner. Computed once per
canary snapshot and cached (enumerating takes about a second)."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass

from turnout.oracle import CanarySnapshot, Pack, enumerate_matrix


@dataclass(frozen=True)
class MatrixSummary:
    num_cells: int
    pins: list[str]  # "auto", "v1", "v2"
    scenarios: list[str]  # column ids in the oracle's order ("default" first)
    # pin → family → scenario → runner ("v1" | "v2" | "none") → cells
    grid: dict[str, dict[str, dict[str, dict[str, int]]]]


def summarise(pack: Pack, canaries: CanarySnapshot | None) -> MatrixSummary:
    grid: dict[str, dict[str, dict[str, Counter[str]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(Counter))
    )
    scenarios: dict[str, None] = {}
    num = 0
    for cell in enumerate_matrix(pack, canaries):
        num += 1
        scenarios.setdefault(cell.scenario.id)
        grid[cell.pin][cell.family][cell.scenario.id][cell.decision.runner or "none"] += 1
    plain = {
        pin: {
            fam: {sc: dict(c) for sc, c in by_sc.items()} for fam, by_sc in sorted(by_fam.items())
        }
        for pin, by_fam in grid.items()
    }
    return MatrixSummary(num, list(plain), list(scenarios), plain)


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
