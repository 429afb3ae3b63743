"""Admission for the service's heavy reads: CSV exports and upgrade previews.

Each of these reads every matching decision (hundreds of thousands) on a worker thread, holding
the interpreter most of the time. Twenty exports at once on ~430,000 decisions left 264 of 337
``GET /api/v1/canaries`` probes (what engines fetch at start-up, with a 0.5 s deadline) over
0.5 s. So at most ``TURNOUT_MAX_HEAVY_READS`` run at once in a process, and at most
``TURNOUT_MAX_HEAVY_READS_PER_TOKEN`` of them for one token; one more is answered
``429 too_many_requests`` with ``Retry-After`` at once, queueing nothing. An export holds its
slot until its last line is sent (or its client goes away).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

#: Seconds a refused client is told to wait (``Retry-After``).
RETRY_AFTER_S = 2


class TooManyHeavyReads(Exception):
    """No slot: the message says which bound was reached."""


class HeavyReads:
    """Slots for heavy reads, in all and per token (thread-safe; one per process)."""

    def __init__(self, max_total: int, max_per_token: int) -> None:
        self.max_total = max_total
        self.max_per_token = max_per_token
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    def acquire(self, who: str) -> None:
        """Take a slot for token ``who``.

        Raises:
            TooManyHeavyReads: ``max_total`` run already, or ``max_per_token`` for ``who``.
        """
        with self._lock:
            if self._running[who] >= self.max_per_token:
                raise TooManyHeavyReads(
                    f"{self.max_per_token} exports or previews of this token are running "
                    "(TURNOUT_MAX_HEAVY_READS_PER_TOKEN): retry when one has finished"
                )
            if sum(self._running.values()) >= self.max_total:
                raise TooManyHeavyReads(
                    f"{self.max_total} exports or previews are running "
                    "(TURNOUT_MAX_HEAVY_READS): retry in a moment"
                )
            self._running[who] += 1

    def release(self, who: str) -> None:
        with self._lock:
            self._running[who] -= 1
            if self._running[who] <= 0:
                del self._running[who]

    def running(self) -> int:
        with self._lock:
            return sum(self._running.values())

    @contextmanager
    def slot(self, who: str) -> Iterator[None]:
        """A slot held for the block (:meth:`acquire`'s errors)."""
        self.acquire(who)
        try:
            yield
        finally:
            self.release(who)

    async def stream(self, who: str, lines: AsyncIterator[str]) -> AsyncIterator[str]:
        """``lines`` with a slot already taken for ``who`` (the caller's :meth:`acquire`),
        released when the stream ends, fails or is closed (a client that went away)."""
        try:
            async for line in lines:
                yield line
        finally:
            self.release(who)
