"""Start-up compilation of the Triton kernels a runner_v2 step launches outside its CUDA graphs.

A captured graph holds its kernels compiled. The kernels around it are not: the staged row
writes, the input preparation (``runner_v2/input_batch.py``), the sampler and its second
reduction, the penalty counts, the logprobs and ``post_update`` are launched per step, and
Triton compiles a variant the first time it meets a new combination of compile-time
constants (block sizes that follow the padded batch, the sampler's vocabulary split). Without
a warm-up, the first request after start-up at a new batch size waited for that compilation
(0.2-0.7 s per variant on an H200, several per shape: a TTFT p99 of 3.7 s at concurrency 1,
``docs/benchmarks.md``).

Runtime counts are kept out of the variants (``do_not_specialize`` on every count argument of
those kernels; each array of the step's upload starts 16-byte aligned, ``runner_v2/uploads.py``),
so the variants left follow a few host values only: the padded request count (the decode
graphs' sizes) and the sampler's split of the vocabulary. :func:`warm_up_steps` plans one step
per such shape; the runner executes them at start-up through its own step path, after the
graphs are captured, with requests of one prompt token on block 0 (two for the first request of
the mixed step) (vLLM's ``_dummy_run`` and
``_dummy_sampler_run`` do the same for MRV1/MRV2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from turnout.engine.kv_cache_manager import cdiv
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import NewRequestData, SchedulerOutput
from turnout.kernels.gumbel_sample import sample_splits

#: Sampling parameters of the dummy requests: the plain path, penalties, and logprobs.
_PLAIN = SamplingParams(max_tokens=1, temperature=1.0, seed=0)
_PENALTY = SamplingParams(max_tokens=1, temperature=1.0, repetition_penalty=1.1, seed=0)
_LOGPROBS = SamplingParams(max_tokens=1, temperature=1.0, logprobs=1, seed=0)


def warm_up_sizes(
    decode_sizes: list[int], max_num_seqs: int, vocab_size: int, vocab_block: int
) -> list[int]:
    """Batch sizes whose steps reach every variant: each decode graph size, and the smallest
    batch of each power-of-two split count of the sampler (its second reduction's block)."""
    sizes = set(decode_sizes)
    seen: set[int] = set()
    for n in range(1, max_num_seqs + 1):
        splits = sample_splits(n, vocab_size, vocab_block)
        key = 1 << max(0, (splits - 1).bit_length())
        if key not in seen:
            seen.add(key)
            sizes.add(n)
    return sorted(sizes)


def warm_up_steps(
    sizes: list[int],
    *,
    block_size: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    mixed: bool,
) -> Iterator[SchedulerOutput]:
    """Scheduler outputs of the warm-up, in order: for each size ``n``, ``min(n,
    max_num_batched_tokens)`` new requests of one prompt token each (a decode-shaped step),
    finished by the next step; one request with penalties; one with logprobs; when ``mixed``
    (mixed-step graphs are captured), a mixed step: a two-token prompt beside one-token ones
    (when ``max_model_len`` holds two tokens); and a last step that finishes them all.

    A graph size above the token budget still replays: a decode batch of the budget's size
    (every request one token) pads up to it, so that batch is what warms it."""
    sizes = sorted({min(n, max_num_batched_tokens) for n in sizes})
    plans: list[list[tuple[int, SamplingParams]]] = [[(1, _PLAIN)] * n for n in sizes]
    plans += [[(1, _PENALTY)], [(1, _LOGPROBS)]]
    if mixed and max_num_batched_tokens >= 2 and max_model_len >= 2:
        plans.append(
            [(2, _PLAIN)]
            + [(1, _PLAIN)] * (min(max(sizes, default=1), max_num_batched_tokens - 1) - 1)
        )
    finished: set[str] = set()
    for k, plan in enumerate(plans):
        out = SchedulerOutput(finished_req_ids=finished)
        finished = set()
        for i, (num_tokens, params) in enumerate(plan):
            req_id = f"_warmup_{k}_{i}"
            out.scheduled_new_reqs.append(
                NewRequestData(
                    req_id=req_id,
                    prompt_token_ids=[0] * num_tokens,
                    sampling_params=params,
                    block_ids=[0] * cdiv(num_tokens, block_size),
                    num_computed_tokens=0,
                )
            )
            out.num_scheduled_tokens[req_id] = num_tokens
            finished.add(req_id)
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        yield out
    yield SchedulerOutput(finished_req_ids=finished)


def run_warm_up(execute: Callable[[SchedulerOutput], Any], steps: Iterator[SchedulerOutput]) -> int:
    """Execute ``steps`` one after the other, collecting each (the runner's own step path);
    returns how many ran."""
    count = 0
    for so in steps:
        out = execute(so)
        get_output = getattr(out, "get_output", None)
        if get_output is not None:
            get_output()
        count += 1
    return count


__all__ = ["run_warm_up", "warm_up_sizes", "warm_up_steps"]
