"""runner_v2 replays every step from a CUDA graph, mixed prefill + decode steps included, and the
replayed steps give the eager path's tokens and logprobs (float32 exactly, bf16 within rounding).

Requests arrive in waves while others decode, and ``max_num_batched_tokens`` is small, so most
steps mix prompt chunks with decodes: they replay the mixed graphs of 64 and 96 tokens (7 of the run's steps)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


def _run(
    path: Path, dtype: str, eager: bool
) -> tuple[dict[str, tuple[list[int], list[float]]], object]:
    config = engine_config_for(
        path,
        device="cuda",
        dtype=dtype,
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=96,
        block_size=4,
        num_kv_blocks=256,
        enforce_eager=eager,
    )
    core = build_engine_core(config, "v2")
    vocab = TINY_DECODER_CONFIGS["qwen3"]["vocab_size"]
    gen = torch.Generator().manual_seed(3)
    params = [
        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=16, temperature=0.8, seed=5, ignore_eos=True, logprobs=2),
    ]
    done = {}
    for wave in range(4):  # a wave of prompts every 5 steps, beside the running decodes
        for i in range(3):
            n = int(torch.randint(5, 70, (1,), generator=gen))
            core.add_request(
                f"w{wave}r{i}", torch.randint(3, vocab, (n,), generator=gen).tolist(), params[i % 2]
            )
        for _ in range(5):
            done.update({r.req_id: r for r in core.step()})
    done.update({r.req_id: r for r in core.run_until_done()})
    out = {
        k: (r.output_token_ids, [lp for c in r.logprobs for lp in c.sampled_logprobs()])
        for k, r in done.items()
    }
    return out, core.runner


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mixed_steps_replay_graphs_and_equal_eager(dtype: str, tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS["qwen3"], tmp_path, dtype=torch.float32, seed=5)
    graphed, runner = _run(tmp_path, dtype, eager=False)
    assert runner.graphs.mixed.sizes == [64, 96] and runner.graphs.mixed.num_captured == 2
    assert runner.num_mixed_graph_steps >= 5 and runner.num_eager_steps == 0  # every step replayed
    del runner
    torch.cuda.empty_cache()
    eager, runner = _run(tmp_path, dtype, eager=True)
    assert runner.num_graph_steps == 0
    assert graphed.keys() == eager.keys() and len(graphed) == 12
    for req_id, (tokens, logprobs) in graphed.items():
        want_tokens, want_lp = eager[req_id]
        assert tokens == want_tokens, req_id
        assert logprobs == pytest.approx(want_lp, abs=1e-5 if dtype == "float32" else 2e-2), req_id


def test_kv_cache_is_sized_after_profiling_the_largest_step(tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS["qwen3"], tmp_path, dtype=torch.float32, seed=5)
    small = build_engine_core(
        engine_config_for(
            tmp_path,
            device="cuda",
            dtype="bfloat16",
            max_model_len=128,
            max_num_seqs=8,
            max_num_batched_tokens=64,
        ),
        "v2",
    )
    assert small.runner.profiled_peak_bytes > 0
    peak_small = small.runner.profiled_peak_bytes
    del small
    torch.cuda.empty_cache()
    large = build_engine_core(
        engine_config_for(
            tmp_path,
            device="cuda",
            dtype="bfloat16",
            max_model_len=128,
            max_num_seqs=8,
            max_num_batched_tokens=4096,
        ),
        "v2",
    )
    assert large.runner.profiled_peak_bytes > peak_small  # activations grow with the step's tokens
