"""Which CUDA graph a runner_v2 step replays (``runner_v2/graphs.py``) and the mixed-step capture
inputs (``engine/cuda_graphs.py``), on the CPU: the sizes, the choice per step kind, the padded
plan, and dummy inputs a real forward accepts. The replays themselves run in
``test_graphs_gpu.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.cuda_graphs import (
    MixedGraphs,
    buffers_forward,
    mixed_capture_sizes,
    set_dummy_mixed_inputs,
)
from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.runner_v2.graphs import RunnerGraphs
from turnout.runner_v2.input_batch import BatchPlan, InputBuffers


def test_mixed_capture_sizes_end_at_the_token_budget() -> None:
    assert mixed_capture_sizes(8192) == [
        64,
        128,
        256,
        384,
        512,
        768,
        1024,
        1536,
        2048,
        3072,
        4096,
        6144,
        8192,
    ]
    assert mixed_capture_sizes(1000) == [64, 128, 256, 384, 512, 768, 1000]
    assert mixed_capture_sizes(32) == [32]
    assert mixed_capture_sizes(100_000)[-1] == 16384  # larger steps run eagerly
    assert mixed_capture_sizes(0) == []


def _plan(num_scheduled: list[int], num_computed: list[int], num_tokens: list[int]) -> BatchPlan:
    rows = np.arange(len(num_scheduled), dtype=np.int32)
    return BatchPlan.build(
        [f"r{i}" for i in rows],
        rows,
        np.asarray(num_scheduled, np.int32),
        np.asarray(num_computed, np.int32),
        np.asarray(num_tokens, np.int32),
    )


class _Captured:  # stands for a torch.cuda.CUDAGraph: choose() only asks which sizes exist
    pass


def _graphs(speculative: bool = False) -> RunnerGraphs:
    config = engine_config_for(
        _model_dir(), max_model_len=128, max_num_seqs=16, max_num_batched_tokens=512
    )
    graphs = RunnerGraphs(config, enabled=True, speculative=speculative)
    for g in (graphs.decode, graphs.spec, graphs.mixed):
        g._graphs = {s: _Captured() for s in g.sizes}  # type: ignore[misc]
    return graphs


_DIR: list[Path] = []


def _model_dir() -> Path:
    if not _DIR:
        import tempfile

        _DIR.append(
            write_random_weights(
                TINY_DECODER_CONFIGS["qwen3"],
                Path(tempfile.mkdtemp()) / "m",
                dtype=torch.float32,
                seed=1,
            )
        )
    return _DIR[0]


def test_each_step_kind_picks_its_graph_and_padding() -> None:
    graphs = _graphs()
    decode = _plan([1, 1, 1], [10, 20, 30], [11, 21, 31])
    assert graphs.choose(decode, False, None) == (graphs.decode, 4)
    padded = graphs.pad(decode, (graphs.decode, 4))
    assert (padded.num_reqs_padded, padded.num_tokens_padded) == (4, 4)
    mixed = _plan([1, 70, 1], [10, 0, 30], [11, 100, 31])  # a prompt chunk beside two decodes
    graph = graphs.choose(mixed, False, None)
    assert graph == (graphs.mixed, 128) and isinstance(graph[0], MixedGraphs)
    padded = graphs.pad(mixed, graph)
    assert (padded.num_reqs_padded, padded.num_tokens_padded) == (16, 128)
    assert padded.num_tokens == 72 and padded.num_reqs == 3  # the real step is unchanged
    assert graphs.choose(mixed, True, None) is None  # prompt logprobs read every hidden row
    assert graphs.choose(_plan([600], [0], [600]), False, None) is None  # above every size


def test_speculation_replays_no_mixed_graph() -> None:
    graphs = _graphs(speculative=True)
    assert graphs.mixed.sizes == []
    assert graphs.choose(_plan([1, 70], [10, 0], [11, 100]), False, None) is None
    assert graphs.choose(_plan([1, 1], [10, 5], [11, 6]), False, None) == (graphs.decode, 2)


def test_mixed_graphs_are_dropped_for_models_that_cannot_replay_them() -> None:
    graphs = _graphs()

    class Mla:
        MIXED_STEP_GRAPHS = False

    graphs.restrict_to(Mla(), has_inner_state=False)
    assert graphs.mixed.sizes == [] and graphs.decode.sizes
    graphs = _graphs()
    graphs.restrict_to(object(), has_inner_state=True)
    assert graphs.mixed.sizes == [] and graphs.decode.sizes == []


@pytest.mark.parametrize(("num_reqs", "num_tokens"), [(16, 512), (16, 64), (16, 5)])
def test_dummy_mixed_inputs_run_a_real_forward(num_reqs: int, num_tokens: int) -> None:
    # The capture's inputs must be a valid step for every launch of the forward: queries that
    # sum to the token count, none longer than a block-table row holds, no slot written.
    core = build_engine_core(
        engine_config_for(
            _model_dir(),
            max_model_len=128,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            num_kv_blocks=64,
        ),
        "v2",
    )
    runner = core.runner
    buffers: InputBuffers = runner.buffers
    set_dummy_mixed_inputs(buffers, num_reqs, num_tokens)
    qsl = buffers.query_start_loc[: num_reqs + 1]
    assert qsl[0] == 0 and qsl[-1] == num_tokens
    q_lens = qsl.diff()
    assert torch.equal(q_lens, buffers.seq_lens[:num_reqs]) and int(q_lens.max()) <= -(
        -num_tokens // num_reqs
    )
    before = [c.clone() for c in runner.kv_caches]
    with torch.inference_mode():
        hidden = buffers_forward(
            runner.model,
            buffers,
            runner.kv_caches,
            num_reqs,
            num_tokens,
            num_tokens,
            max_model_len=128,
            block_size=runner.config.block_size,
        )
    assert hidden.shape[0] == num_tokens and torch.isfinite(hidden).all()
    assert all(torch.equal(a, b) for a, b in zip(before, runner.kv_caches, strict=True))


def test_memory_profile_runs_the_largest_step_and_sets_its_peak_aside() -> None:
    from turnout.runner_v2.memory_profile import kv_budget_after_profile, profile_peak_bytes

    core = build_engine_core(
        engine_config_for(
            _model_dir(),
            max_model_len=128,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            num_kv_blocks=64,
        ),
        "v2",
    )
    runner = core.runner
    before = [c.clone() for c in runner.kv_caches]
    # On the CPU the profile runs (a check that the largest step's forward works) but measures nothing.
    assert (
        profile_peak_bytes(runner.model, runner.buffers, runner.config, runner.dtype, runner.device)
        == 0
    )
    assert all(torch.equal(a, b) for a, b in zip(before, runner.kv_caches, strict=True))
    assert kv_budget_after_profile(10_000, 1_000, graph_pool=False) == 8_100
    assert kv_budget_after_profile(10_000, 1_000, graph_pool=True) == 7_200
    assert kv_budget_after_profile(1_000, 1_000, graph_pool=True) == 0


def test_no_mixed_graph_or_profile_holds_more_tokens_than_the_requests_can() -> None:
    # max_num_seqs requests of at most max_model_len tokens each: 2 x 32 = 64 tokens, below the
    # token budget of 512. Larger captures and profiles gave a dummy request more keys than
    # its block-table row holds: the attention kernel read past the row (and the table), and
    # the profile reserved activations of a step that can never run.
    config = engine_config_for(
        _model_dir(), max_model_len=32, max_num_seqs=2, max_num_batched_tokens=512, num_kv_blocks=8
    )
    assert RunnerGraphs(config, enabled=True, speculative=False).mixed.sizes == [64]
    from turnout.runner_v2.memory_profile import profile_peak_bytes

    runner = build_engine_core(config, "v2").runner
    assert (
        profile_peak_bytes(runner.model, runner.buffers, config, runner.dtype, runner.device) == 0
    )
    row_capacity = config.max_num_blocks_per_req * config.block_size
    assert int(runner.buffers.seq_lens.max()) <= row_capacity
