"""Asynchronous output: a step's results reach the host without stalling the next step.

At the end of a step the runner hands its result tensors (sampled ids, logprobs, prompt
logprobs, embeddings) to :class:`AsyncOutput`, which copies them into pinned host memory on a
side stream, after the step's kernels, and records an event. ``execute_model`` returns at once;
the engine launches step N+1 and only then calls :meth:`AsyncOutput.get_output` for step N,
which waits on the event and assembles the ``ModelRunnerOutput``. This module is the only place
of runner_v2 where the host waits for the device (vLLM MRV2's ``AsyncOutput``; the grep test of
``tests/runner_v2`` holds the rest of the step path to it).

On CPU there is no stream: the copies are plain and ``get_output`` only assembles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from turnout.engine.outputs import Logprobs, ModelRunnerOutput, PromptLogprobs


@dataclass
class StepResults:
    """What a step produced, on the device, and how to read it back (host metadata).

    Attributes:
        req_ids: the step's requests in batch order.
        samples: ``[num_reqs] bool`` (host) requests that sampled (partial prefills did not).
        sampled: ``[num_reqs] int32`` sampled ids (device), or ``None`` (pooling steps); a
            speculative step: ``[num_reqs, k + 1] int32``, the first ``num_sampled`` of each row.
        num_sampled: ``[num_reqs] int32`` tokens per request of a speculative step (device).
        num_drafts: ``[num_reqs] int32`` drafts each verified (device; speculative steps).
        num_spec: ``[num_reqs]`` drafts each had scheduled (host; speculative steps).
        logprob_reqs: ``(batch positions, k)`` of the requests with logprobs (host arrays).
        logprobs: rows for those requests (``[n, 1 + max_k]`` in row chunks); a speculative
            step has ``logprob_spans[j]`` rows for the j-th of them, of which its first
            ``num_sampled`` are delivered.
        prompt_reqs: ``(req_ids, starts, counts, ks)`` of the requests scoring prompt tokens.
        prompt_logprobs: their rows, back to back (row chunks).
        pooled: ``req_id`` order of ``embeddings``; ``embeddings`` ``[n, hidden] float32``.
    """

    req_ids: list[str]
    samples: np.ndarray
    sampled: torch.Tensor | None = None
    num_sampled: torch.Tensor | None = None
    num_drafts: torch.Tensor | None = None
    num_spec: np.ndarray | None = None
    logprob_spans: np.ndarray | None = None
    logprob_reqs: tuple[np.ndarray, np.ndarray] | None = None
    logprobs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    prompt_reqs: tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None = None
    prompt_logprobs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )
    pooled: list[str] = field(default_factory=list)
    embeddings: torch.Tensor | None = None


class AsyncOutput:
    """A step's results on their way to the host (implements ``AsyncModelRunnerOutput``).

    Args:
        results: the step's results (device tensors are kept alive until the copy ran).
        copy_stream: side stream for the device-to-host copies (``None`` on CPU).
    """

    def __init__(self, results: StepResults, copy_stream: torch.cuda.Stream | None) -> None:
        self._results = results
        tensors = self._device_tensors(results)
        self._event: torch.cuda.Event | None = None
        if copy_stream is None:
            self._host = [t.detach().to("cpu") for t in tensors]
            return
        main = torch.cuda.current_stream()
        copy_stream.wait_stream(main)  # the copies start after the step's kernels
        with torch.cuda.stream(copy_stream):
            self._host = []
            for t in tensors:
                pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                pinned.copy_(t, non_blocking=True)
                t.record_stream(copy_stream)  # the allocator must not reuse it before the copy
                self._host.append(pinned)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch.cuda.Event.__new__ is unannotated
            self._event.record(copy_stream)

    @staticmethod
    def _device_tensors(r: StepResults) -> list[torch.Tensor]:
        out = [] if r.sampled is None else [r.sampled]
        if r.num_sampled is not None and r.num_drafts is not None:
            out += [r.num_sampled, r.num_drafts]
        for chunks in (r.logprobs, r.prompt_logprobs):
            for chunk in chunks:
                out.extend(chunk)
        if r.embeddings is not None:
            out.append(r.embeddings)
        return out

    # The one place where runner_v2 waits for the device: collecting a step's results.
    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copies, then assemble the engine's ``ModelRunnerOutput``."""
        if self._event is not None:
            self._event.synchronize()
        r = self._results
        host = [t.numpy() for t in self._host]
        out = ModelRunnerOutput(req_ids=list(r.req_ids), sampled_token_ids=[[] for _ in r.req_ids])
        counts = np.ones(len(r.req_ids), np.int64)
        if r.sampled is not None:
            sampled = host.pop(0).tolist()
            if r.num_sampled is not None:
                counts, verified = host.pop(0).astype(np.int64), host.pop(0).tolist()
                _speculative_tokens(out, r, sampled, counts.tolist(), verified)
            else:
                for i, samples in enumerate(r.samples.tolist()):
                    if samples:
                        out.sampled_token_ids[i] = [sampled[i]]
        if r.logprobs and r.logprob_reqs is not None:
            ids, lps, ranks = _concat(host, len(r.logprobs))
            positions, ks = r.logprob_reqs
            spans = (
                r.logprob_spans
                if r.logprob_spans is not None
                else np.ones(len(positions), np.int64)
            )
            starts = (np.cumsum(spans) - spans).tolist()
            for j, (i, k) in enumerate(zip(positions.tolist(), ks.tolist(), strict=True)):
                a = starts[j]
                out.logprobs[r.req_ids[i]] = _logprobs(ids, lps, ranks, a, a + int(counts[i]), k)
        if r.prompt_logprobs and r.prompt_reqs is not None:
            ids, lps, ranks = _concat(host, len(r.prompt_logprobs))
            a = 0
            req_ids, starts, counts, ks = r.prompt_reqs
            for req_id, start, count, k in zip(
                req_ids, starts.tolist(), counts.tolist(), ks.tolist(), strict=True
            ):
                b = a + count
                out.prompt_logprobs[req_id] = PromptLogprobs(
                    start, _logprobs(ids, lps, ranks, a, b, k)
                )
                a = b
        if r.embeddings is not None:
            embeddings = host.pop(0)
            for j, req_id in enumerate(r.pooled):
                out.pooled_outputs[req_id] = embeddings[j].copy()
        return out


def _speculative_tokens(
    out: ModelRunnerOutput,
    r: StepResults,
    sampled: list[list[int]],
    counts: list[int],
    verified: list[int],
) -> None:
    # Each request's accepted drafts and the token after them; the drafts it verified where
    # it had some scheduled (the scheduler's acceptance counters).
    assert r.num_spec is not None
    for i, (samples, num_spec) in enumerate(
        zip(r.samples.tolist(), r.num_spec.tolist(), strict=True)
    ):
        if samples:
            out.sampled_token_ids[i] = sampled[i][: counts[i]]
            if num_spec:
                out.num_draft_tokens[r.req_ids[i]] = verified[i]


def _concat(host: list[np.ndarray], num_chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Takes num_chunks (ids, logprobs, ranks) triples off the front of host, joined by rows.
    chunks = [(host.pop(0), host.pop(0), host.pop(0)) for _ in range(num_chunks)]
    if num_chunks == 1:
        return chunks[0]
    return tuple(np.concatenate([c[j] for c in chunks]) for j in range(3))  # type: ignore[return-value]


def _logprobs(
    ids: np.ndarray, lps: np.ndarray, ranks: np.ndarray, a: int, b: int, k: int
) -> Logprobs:
    # Copies: the engine keeps these for the request's life; the pinned buffer goes back to
    # the allocator's cache.
    return Logprobs(ids[a:b, : 1 + k].copy(), lps[a:b, : 1 + k].copy(), ranks[a:b].copy())


__all__ = ["AsyncOutput", "StepResults"]
