"""V2ModelRunner's protocol behaviour on CPU (kernels interpreted): asynchronous results, the
engine's asynchronous loop, its checks against the engine, and the CPU interpreter guard."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineConfigError
from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams
from turnout.kernels import _triton
from turnout.runner_v2 import create_model_runner
from turnout.runner_v2.async_output import AsyncOutput


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v2-llama")
    write_random_weights(TINY_DECODER_CONFIGS["llama"], path, dtype=torch.float32, seed=3)
    return path


def test_steps_return_async_outputs_collected_one_step_later(llama_dir: Path) -> None:
    core = build_engine_core(
        engine_config_for(llama_dir, max_model_len=128, kv_cache_memory_gb=0.01), "v2"
    )
    assert core.async_scheduling and core.scheduler.async_scheduling
    core.add_request(
        "a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    )
    handles = []
    real = core.runner.execute_model

    def spy(so):
        out = real(so)
        handles.append(out)
        return out

    core.runner.execute_model = spy  # type: ignore[method-assign]
    (req,) = core.run_until_done()
    assert len(req.output_token_ids) == 3
    launched = [h for h in handles if isinstance(h, AsyncOutput)]
    assert len(launched) == 3  # prefill + 2 decodes, each an AsyncOutput
    assert [h.get_output().sampled_token_ids for h in launched] == [
        [[t]] for t in req.output_token_ids
    ]


def test_a_runner_out_of_step_with_the_engine_is_an_error(llama_dir: Path) -> None:
    core = build_engine_core(
        engine_config_for(llama_dir, max_model_len=128, kv_cache_memory_gb=0.01), "v2"
    )
    core.add_request("a", [5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    core.step()
    row = core.runner.states.req_id_to_row["a"]
    core.runner.states.num_computed_np[row] += 1
    with pytest.raises(RuntimeError, match="the engine says 3 computed tokens, the runner 4"):
        core.step()


def test_cpu_without_the_interpreter_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_triton, "INTERPRETED", False)
    with pytest.raises(EngineConfigError, match="TRITON_INTERPRET=1"):
        create_model_runner(EngineConfig(model=str(tmp_path), vocab_size=100, max_model_len=64))
