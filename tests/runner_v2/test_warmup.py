"""runner_v2's start-up warm-up (runner_v2/warmup.py): the sizes it plans reach every decode
graph size and every split class of the sampler, its steps fit the engine's limits and finish
every dummy request, and a runner that ran it serves exactly what a fresh runner serves (CPU,
kernels interpreted; tests/runner_v2/test_warmup_gpu.py checks that nothing compiles later)."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.cuda_graphs import capture_sizes
from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams
from turnout.kernels._triton import INTERPRETED
from turnout.kernels.gumbel_sample import sample_splits
from turnout.runner_v2 import sampler
from turnout.runner_v2.warmup import warm_up_sizes, warm_up_steps


def _split_class(n: int, vocab_size: int, block: int) -> int:
    return 1 << max(0, (sample_splits(n, vocab_size, block) - 1).bit_length())


@pytest.mark.parametrize(
    ("max_num_seqs", "vocab_size"), [(256, 151_936), (1024, 151_936), (3000, 32_000), (5, 512)]
)
def test_sizes_reach_every_graph_size_and_split_class(max_num_seqs: int, vocab_size: int) -> None:
    graphs = capture_sizes(max_num_seqs)
    sizes = warm_up_sizes(graphs, max_num_seqs, vocab_size, 1024)
    assert set(graphs) <= set(sizes) and max(sizes) <= max_num_seqs
    every = {_split_class(n, vocab_size, 1024) for n in range(1, max_num_seqs + 1)}
    assert every == {_split_class(n, vocab_size, 1024) for n in sizes}


def test_steps_fit_the_budget_and_finish_every_dummy_request() -> None:
    steps = list(
        warm_up_steps(
            [1, 2, 8, 16, 128],
            block_size=16,
            max_num_batched_tokens=64,
            max_model_len=32,
            mixed=True,
        )
    )
    live: set[str] = set()
    seen: set[str] = set()
    for so in steps:
        assert so.finished_req_ids == live  # the previous step's requests, no others
        live = {r.req_id for r in so.scheduled_new_reqs}
        assert not live & seen  # ids are never reused
        seen |= live
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values()) <= 64
        for r in so.scheduled_new_reqs:
            assert len(r.block_ids) == -(-len(r.prompt_token_ids) // 16)
            assert so.num_scheduled_tokens[r.req_id] == len(r.prompt_token_ids)
    assert not live  # the last step only finishes
    sizes = [len(so.scheduled_new_reqs) for so in steps]
    # 128 is over the budget: a batch of 64 pads up to it; the mixed step has 63 requests + 1 token
    assert sizes == [1, 2, 8, 16, 64, 1, 1, 63, 0]
    penalty, logprobs, mixed = steps[5], steps[6], steps[7]
    assert penalty.scheduled_new_reqs[0].sampling_params.repetition_penalty != 1.0
    assert logprobs.scheduled_new_reqs[0].sampling_params.logprobs == 1
    assert max(mixed.num_scheduled_tokens.values()) == 2
    # A token table one token wide holds no two-token prompt: no mixed step then
    narrow = list(
        warm_up_steps([1], block_size=16, max_num_batched_tokens=64, max_model_len=1, mixed=True)
    )
    assert (
        all(max(so.num_scheduled_tokens.values(), default=1) == 1 for so in narrow)
        and len(narrow) == 4
    )


def _padded(n: int, graph_sizes: list[int]) -> int | None:
    return next((g for g in graph_sizes if g >= n), None)


@pytest.mark.parametrize(
    ("max_num_seqs", "max_num_batched_tokens"), [(16, 9), (256, 200), (64, 64), (24, 96), (5, 3)]
)
def test_every_decode_graph_a_step_can_replay_is_warmed(
    max_num_seqs: int, max_num_batched_tokens: int
) -> None:
    # A graph size above the token budget still replays (a batch of the budget's size pads up to
    # it): the warm-up dropped it, so the input kernels' padded variant compiled mid-serving.
    graphs = capture_sizes(max_num_seqs)
    sizes = warm_up_sizes(graphs, max_num_seqs, 151_936, 1024)
    steps = warm_up_steps(
        sizes,
        block_size=16,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=64,
        mixed=False,
    )
    warmed = {_padded(len(so.scheduled_new_reqs), graphs) for so in steps if so.scheduled_new_reqs}
    reached = {_padded(n, graphs) for n in range(1, min(max_num_seqs, max_num_batched_tokens) + 1)}
    assert reached <= warmed


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v2-warmup")
    write_random_weights(TINY_DECODER_CONFIGS["llama"], path, dtype=torch.float32, seed=11)
    return path


def _serve(llama_dir: Path, warm: bool) -> dict[str, tuple[list[int], list[float]]]:
    config = engine_config_for(
        llama_dir,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        block_size=4,
        kv_cache_memory_gb=0.01,
    )
    core = build_engine_core(config, "v2")
    if warm:
        runner = core.runner
        assert runner.warm_up(sizes=[1, 3], mixed=True) == 6
        assert runner.warm_up(sizes=[2]) == 4  # 2 requests, penalties, logprobs, the finish
        assert runner.num_warm_up_steps == 4 and runner.warm_up_seconds > 0
        assert runner.states.num_reqs == 0 and runner.num_eager_steps == 0  # counters start afresh
    params = [
        SamplingParams(max_tokens=6, temperature=0.9, seed=1, ignore_eos=True),
        SamplingParams(
            max_tokens=6, temperature=0.7, seed=2, repetition_penalty=1.3, ignore_eos=True
        ),
        SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True),
    ]
    for i, p in enumerate(params):
        core.add_request(f"r{i}", [3 + i, 9, 14, 2 + i, 7][: 3 + i], p)
    done = core.run_until_done()
    return {
        r.req_id: (r.output_token_ids, [lp for c in r.logprobs for lp in c.sampled_logprobs()])
        for r in done
    }


def test_a_warmed_up_runner_serves_what_a_fresh_one_serves(llama_dir: Path) -> None:
    fresh = _serve(llama_dir, warm=False)
    warmed = _serve(llama_dir, warm=True)
    assert warmed == fresh and len(fresh) == 3


def _tiny_core(llama_dir: Path, **kwargs: object) -> object:
    config = engine_config_for(
        llama_dir,
        **{
            "max_model_len": 32,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 32,
            "block_size": 4,
            "num_kv_blocks": 8,
            **kwargs,
        },
    )
    return build_engine_core(config, "v2")


def test_a_warm_up_after_serving_is_refused(llama_dir: Path) -> None:
    # The dummy requests write KV block 0. After a request ran, block 0 may be a cached prefix:
    # a warm-up then made the next request with that prefix read the dummies' keys and values
    # (greedy [128, 116, 69, 4] became [128, 109, 69, 72] for the same prompt).
    core = _tiny_core(llama_dir)
    prompt = [3, 9, 14, 2, 7, 8, 11, 5, 6]  # two full blocks: cached, the first in block 0
    core.add_request("a", prompt, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    core.run_until_done()
    with pytest.raises(RuntimeError, match="start-up only"):
        core.runner.warm_up(sizes=[1])


def test_warm_up_sizes_beyond_the_table_are_refused_before_any_step(llama_dir: Path) -> None:
    # Past max_num_seqs, add_request failed mid warm-up and left dummy requests holding rows.
    runner = _tiny_core(llama_dir).runner
    with pytest.raises(ValueError, match="max_num_seqs=4"):
        runner.warm_up(sizes=[1, 5])
    assert runner.states.num_reqs == 0 and runner.num_eager_steps == 0
    assert runner.warm_up(sizes=[4]) == 4


@contextlib.contextmanager
def _launch_variants() -> Iterator[set[tuple[str, tuple[Any, ...]]]]:
    """Triton's specialization key (what picks, or compiles, a variant on a GPU) of each launch of
    a ``kernels/`` kernel while inside, from Triton's own ``specialize_impl``: the interpreter
    that runs them on CPU compiles nothing, but its arguments say what a GPU would have keyed
    (CPU tensors are 64-byte aligned, as the caching allocator's blocks are 512)."""
    if not INTERPRETED:
        pytest.skip(
            "on a GPU tests/runner_v2/test_warmup_gpu.py counts the compiled variants themselves"
        )
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    jit = pytest.importorskip("triton.runtime.jit")
    specialize = getattr(jit, "native_specialize_impl", None)
    if specialize is None or not hasattr(interpreter, "InterpretedFunction"):
        pytest.skip("this Triton computes specialization keys elsewhere")
    cls = interpreter.InterpretedFunction
    run = cls.run
    keys: set[tuple[str, tuple[Any, ...]]] = set()

    def recording(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if self.fn.__module__.startswith("turnout.kernels."):
            params = inspect.signature(self.fn).parameters
            bound = dict(zip(params, args, strict=False)) | {
                k: v for k, v in kwargs.items() if k in params
            }
            dns = set(self.kwargs.get("do_not_specialize") or ())
            dnsa = set(self.kwargs.get("do_not_specialize_on_alignment") or ())
            key = tuple(
                (name, "constexpr", bound.get(name, p.default))
                if "constexpr" in str(p.annotation)
                else (
                    name,
                    *specialize(
                        jit.BaseBackend,
                        bound.get(name, p.default),
                        False,
                        name not in dns,
                        name not in dnsa,
                    ),
                )
                for name, p in params.items()
            )
            keys.add((f"{self.fn.__module__}.{self.fn.__name__}", key))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    cls.run = recording
    try:
        yield keys
    finally:
        cls.run = run


def test_logprob_steps_launch_no_variant_the_warm_up_lacks(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Logprob rows go to topk_logprobs in chunks; at Qwen3's 151,936 ids a chunk is 6 rows, so
    # the second one started 24 bytes into the int32 inputs (not 16-byte aligned: another
    # variant), and a step whose every k is 0 passed empty (null, "aligned") outputs: another.
    vocab = TINY_DECODER_CONFIGS["llama"]["vocab_size"]
    monkeypatch.setattr(sampler, "WORKING_SET_ELEMS", 6 * vocab)
    core = _tiny_core(llama_dir, max_num_seqs=8, num_kv_blocks=32)
    with _launch_variants() as warm:
        core.runner.warm_up(sizes=[1, 8])
    with _launch_variants() as served:
        for i in range(8):
            core.add_request(
                f"r{i}",
                [3 + i, 9],
                SamplingParams(max_tokens=2, temperature=0.8, seed=i, logprobs=1, ignore_eos=True),
            )
        core.run_until_done()
        core.add_request(
            "k0",
            [5, 9],
            SamplingParams(max_tokens=2, temperature=0.8, seed=9, logprobs=0, ignore_eos=True),
        )
        core.run_until_done()
    assert {name for name, _ in served} >= {"turnout.kernels.topk_logprobs._topk_logprobs_kernel"}
    assert not {name for name, key in served - warm}
