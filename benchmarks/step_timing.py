"""Step times of an engine pass by kind: where a runner's wall time goes between its steps.

``drive(core)`` is ``core.run_until_done()`` with each ``EngineCore.step()`` call timed and
charged to the step it collects: ``decode`` (one token per request, and the drafts it verifies
under speculative decoding) or ``mixed`` (a prompt chunk in it). Under asynchronous scheduling (runner_v2) a call plans and launches step N+1, then waits
for step N's results: its time is step N's, and ``wait`` is the part spent waiting for the
device. A call that hardly waits found its step done already: the host, not the GPU, set the
pace. Also reported: the same split by transition (the kind collected and the kind launched in
one call) and the time the garbage collector ran during the pass, by generation.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def result_waits() -> Iterator[list[float]]:
    """Seconds each ``AsyncOutput.get_output`` waited on its event (runner_v2), in call order."""
    import turnout.runner_v2.async_output as async_output

    waits: list[float] = []
    original = async_output.AsyncOutput.get_output

    def timed(self: Any) -> Any:
        t0 = time.perf_counter()
        if self._event is not None:
            self._event.synchronize()
        waits.append(time.perf_counter() - t0)
        return original(self)

    async_output.AsyncOutput.get_output = timed  # type: ignore[method-assign]
    try:
        yield waits
    finally:
        async_output.AsyncOutput.get_output = original  # type: ignore[method-assign]


@contextmanager
def gc_time() -> Iterator[dict[str, float]]:
    """Collections and seconds of the garbage collector by generation while inside."""
    totals: dict[str, float] = defaultdict(float)
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            totals[f"gen{info['generation']}_seconds"] += time.perf_counter() - started.pop()
            totals[f"gen{info['generation']}_collections"] += 1

    gc.callbacks.append(callback)
    try:
        yield totals
    finally:
        gc.callbacks.remove(callback)


def _stats(walls: list[float], waits: list[float]) -> dict[str, float]:
    out = {
        "steps": len(walls),
        "seconds": round(sum(walls), 3),
        "ms_per_step": round(sum(walls) / len(walls) * 1e3, 2),
        "p50_ms": round(statistics.median(walls) * 1e3, 2),
        "p90_ms": round(sorted(walls)[math.ceil(0.9 * len(walls)) - 1] * 1e3, 2),
        "max_ms": round(max(walls) * 1e3, 2),
    }
    if waits:
        out["wait_ms_per_step"] = round(sum(waits) / len(waits) * 1e3, 2)
        out["host_ms_per_step"] = round((sum(walls) - sum(waits)) / len(walls) * 1e3, 2)
    return out


def drive(core: Any) -> tuple[list[Any], dict[str, Any]]:
    """Run ``core`` until done (see the module docstring); the finished requests and the
    summary: per kind ``steps``, ``seconds``, ``ms_per_step``, ``p50_ms``, ``p90_ms``, ``max_ms``
    and, for asynchronous runners, ``wait_ms_per_step`` / ``host_ms_per_step``; ``transitions``
    (``"<collected> <- <launched>"``) and ``gc``."""
    kinds: list[str] = []
    runner = core.runner
    execute = runner.execute_model
    wrapped = vars(runner).get("execute_model")  # someone's wrapper already: put it back after

    def recording(so: Any) -> Any:
        if so.total_num_scheduled_tokens:
            # Drafts scheduled for verification are not prompt tokens: a speculative decode is a decode.
            drafts = sum(len(d) for d in so.scheduled_spec_decode_tokens.values())
            prompt = so.total_num_scheduled_tokens - drafts > len(so.num_scheduled_tokens)
            kinds.append("mixed" if prompt else "decode")
        return execute(so)

    runner.execute_model = recording
    steps: list[tuple[str, str, float, float | None]] = []  # collected, launched, wall, wait
    done: list[Any] = []
    in_flight: int | None = None  # the step an asynchronous engine collects at its next call
    try:
        with result_waits() as waits, gc_time() as gc_totals:
            while core.has_unfinished_requests():
                before, num_waits = len(kinds), len(waits)
                t0 = time.perf_counter()
                done.extend(core.step())
                dt = time.perf_counter() - t0
                launched = before if len(kinds) > before else None
                collected = in_flight if core.async_scheduling else launched
                in_flight = launched
                if collected is not None:
                    wait = sum(waits[num_waits:]) if len(waits) > num_waits else None
                    steps.append(
                        (
                            kinds[collected],
                            kinds[launched] if launched is not None else "none",
                            dt,
                            wait,
                        )
                    )
    finally:
        if wrapped is None:
            del runner.execute_model  # the bound method again
        else:
            runner.execute_model = wrapped
    return done, summarize(steps, dict(gc_totals))


def summarize(
    steps: list[tuple[str, str, float, float | None]], gc_totals: dict[str, float]
) -> dict[str, Any]:
    """The summary of :func:`drive` from its per-step records."""
    summary: dict[str, Any] = {}
    groups: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    moves: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    for collected, launched, wall, wait in steps:
        groups[collected].append((wall, wait))
        moves[f"{collected} <- {launched}"].append((wall, wait))
    for kind, rows in groups.items():
        summary[kind] = _stats([w for w, _ in rows], [x for _, x in rows if x is not None])
    summary["transitions"] = {
        k: _stats([w for w, _ in v], [x for _, x in v if x is not None])
        for k, v in sorted(moves.items())
    }
    summary["gc"] = {k: round(v, 4) for k, v in sorted(gc_totals.items())}
    return summary


__all__ = ["drive", "gc_time", "result_waits", "summarize"]
