"""Tensor parallelism's engine side (gloo, CPU): bad ``tensor_parallel_size`` values refused by
name before any process starts; the heads each rank keeps; a rank that dies or raises makes the
engine fail with :class:`TensorParallelError` naming it, within seconds and with no process
left; shutdown stops the workers. Equality with one rank: tests/parity/test_parity_tensor_parallel.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "model"))
sys.path.insert(0, str(Path(__file__).parent))
from tiny_model_configs import TINY_DECODER_CONFIGS, TINY_MOE_CONFIGS
from tp_helpers import FAULT, fail_joining_on_rank_1, fail_third_step_on_rank_1

from turnout.engine.config import EngineConfig, SpeculativeConfig
from turnout.engine.errors import EngineConfigError, EngineError, TensorParallelError
from turnout.engine.llm import LLM
from turnout.engine.model import ModelConfig, write_random_weights
from turnout.engine.model.parallel_layers import TensorParallel, _Heads, tensor_parallel_problem
from turnout.engine.model_info import engine_config_for
from turnout.engine.parallel.executor import TensorParallelRunner, timeout_from_env
from turnout.engine.runner_loader import start_engine_core
from turnout.engine.sampling_params import SamplingParams

LLAMA = TINY_DECODER_CONFIGS["llama"]  # 4 query heads, 2 KV heads, intermediate 96
#: Seconds within which a failed rank must surface as an error (it takes well under one).
BOUND_S = 15.0


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tp-llama")
    write_random_weights(LLAMA, path, dtype=torch.float32, seed=3)
    return path


def _config_dir(tmp_path: Path, hf_config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(hf_config))  # the refusals need no weights
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "tp", "fragment"),
    [
        pytest.param({}, 3, "num_attention_heads (4)", id="query heads not divisible"),
        pytest.param(
            {"num_attention_heads": 12, "head_dim": 16},
            3,
            "num_key_value_heads (2)",
            id="kv heads neither divisible nor a divisor",
        ),
        pytest.param(
            {"intermediate_size": 98},
            4,
            "intermediate_size (98)",
            id="intermediate size not divisible",
        ),
    ],
)
def test_sizes_the_model_cannot_be_split_by_are_refused(
    tmp_path: Path, changes: dict[str, Any], tp: int, fragment: str
) -> None:
    path = _config_dir(tmp_path, {**LLAMA, **changes})
    with pytest.raises(ValueError, match=rf"tensor_parallel_size={tp}: .*{re.escape(fragment)}"):
        engine_config_for(path, tensor_parallel_size=tp, device="cpu")


def test_families_without_plain_attention_are_refused_by_name(tmp_path: Path) -> None:
    path = _config_dir(tmp_path, TINY_MOE_CONFIGS["qwen3-moe"])
    with pytest.raises(
        EngineConfigError,
        match=r"tensor_parallel_size=2: .*Qwen3MoeForCausalLM \(model_type qwen3_moe\)",
    ):
        engine_config_for(path, tensor_parallel_size=2, device="cpu")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an int >= 1"),
        ({"tensor_parallel_size": "2"}, "tensor_parallel_size must be an int >= 1"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be an int >= 1"),
        (
            {"tensor_parallel_size": 2, "cpu_offload_gb": 1.0},
            "tensor_parallel_size=2 with cpu_offload_gb",
        ),
        ({"tensor_parallel_size": 2, "device": "cuda:1"}, "rank r runs on cuda:r"),
        (
            {
                "tensor_parallel_size": 2,
                "speculative_config": SpeculativeConfig(method="draft_model", model="d"),
            },
            "draft model is not sharded",
        ),
        (
            {"tensor_parallel_size": 2, "runner_kind": "pooling", "pooling_tasks": ("embed",)},
            "pooling models",
        ),
    ],
)
def test_engine_config_refuses_what_tensor_parallelism_does_not_do(
    fields: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(EngineConfigError, match=fragment):
        EngineConfig(model="m", vocab_size=100, max_model_len=64, **fields)


@pytest.mark.parametrize(
    ("heads", "kv", "tp"), [(4, 2, 2), (8, 4, 2), (9, 3, 3), (4, 2, 4), (8, 1, 4), (16, 8, 8)]
)
def test_each_rank_keeps_the_kv_heads_its_query_heads_read(heads: int, kv: int, tp: int) -> None:
    # KV heads are split when they are at least as many as the ranks, else replicated (vLLM).
    config = ModelConfig.from_hf_dict(
        {
            **LLAMA,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": 16,
            "intermediate_size": 96 * tp,
        }
    )
    assert tensor_parallel_problem(config, tp) is None
    group = heads // kv
    for rank in range(tp):
        h = _Heads.of(config, TensorParallel(rank, tp))
        assert (h.q_start, h.q_count) == (rank * heads // tp, heads // tp)
        needed = sorted({q // group for q in range(h.q_start, h.q_start + h.q_count)})
        assert list(range(h.kv_start, h.kv_start + h.kv_count)) == needed


def test_a_bad_size_on_the_command_line_names_the_flag(llama_dir: Path) -> None:
    from turnout.oracle.cli import _register_plugins, app

    _register_plugins()
    res = CliRunner().invoke(
        app, ["generate", "--model", str(llama_dir), "--prompt", "x", "--device", "cpu", "-tp", "3"]
    )
    assert res.exit_code == 2, res.output
    assert "tensor_parallel_size=3" in res.output and "num_attention_heads (4)" in res.output


def test_timeout_comes_from_the_environment() -> None:
    assert timeout_from_env({"TURNOUT_TP_TIMEOUT_S": "2.5"}) == 2.5
    with pytest.raises(EngineError, match="TURNOUT_TP_TIMEOUT_S must be a number of seconds > 0"):
        timeout_from_env({"TURNOUT_TP_TIMEOUT_S": "soon"})


def _assert_no_worker_left(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # ended and reaped
            os.kill(pid, 0)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("turnout-tp-")]
    assert not dist.is_initialized()  # the groups were left: another engine may start here


def test_a_killed_worker_makes_generate_raise_naming_it(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = LLM(llama_dir, device="cpu", environ={}, max_model_len=128, tensor_parallel_size=2)
    tp_runner = llm.core.runner
    pids = list(tp_runner.worker_pids.values())
    rank0, steps, killed = tp_runner.runner, [], []
    execute = rank0.execute_model

    def kill_rank_1_at_step_3(scheduler_output: Any) -> Any:
        steps.append(1)
        if len(steps) == 3:  # mid-run: the forward's first all_reduce meets a dead peer
            os.kill(pids[0], signal.SIGKILL)
            killed.append(time.monotonic())
        return execute(scheduler_output)

    monkeypatch.setattr(rank0, "execute_model", kill_rank_1_at_step_3)
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    with pytest.raises(TensorParallelError) as info:
        llm.generate([[5, 6, 7], [8, 9]], params)
    assert time.monotonic() - killed[0] < BOUND_S
    assert info.value.rank == 1 and info.value.code == "tensor_parallel_rank_failed"
    assert str(info.value) == (
        "tensor-parallel rank 1 failed: its process was killed by signal SIGKILL; "
        "every rank was stopped"
    )
    _assert_no_worker_left(pids)
    with pytest.raises(TensorParallelError, match="rank 1 failed"):  # and every later call
        llm.generate([[5, 6, 7]], params)


def test_a_worker_exception_names_the_rank_and_its_error(llama_dir: Path) -> None:
    config = engine_config_for(
        llama_dir, device="cpu", max_model_len=128, kv_cache_memory_gb=0.01, tensor_parallel_size=2
    )
    runner = TensorParallelRunner("v1", config, worker_init=fail_third_step_on_rank_1)
    pids = list(runner.worker_pids.values())
    core = start_engine_core(config, runner)
    core.add_request("a", [5, 6, 7], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    started = time.monotonic()
    with pytest.raises(TensorParallelError) as info:
        core.run_until_done()
    assert time.monotonic() - started < BOUND_S
    assert info.value.rank == 1
    assert info.value.cause.startswith(f"RuntimeError: {FAULT} on rank 1 (at ")
    _assert_no_worker_left(pids)


def test_a_worker_failing_before_it_joins_the_groups_is_named_at_once(llama_dir: Path) -> None:
    # Rank 0 joined the groups as soon as the workers had imported torch: a worker failing
    # later (connecting to the store, selecting its GPU) left it waiting for the whole
    # timeout (300 s by default), then raising the store's error, which names no rank.
    config = engine_config_for(llama_dir, device="cpu", max_model_len=128, tensor_parallel_size=2)
    started = time.monotonic()
    with pytest.raises(TensorParallelError) as info:
        TensorParallelRunner(
            "v1", config, worker_init=fail_joining_on_rank_1, timeout_s=3 * BOUND_S
        )
    assert time.monotonic() - started < BOUND_S
    assert info.value.rank == 1
    assert info.value.cause.startswith(f"RuntimeError: {FAULT} on rank 1 (at ")
    assert not dist.is_initialized()


def _processor_of_a_module_the_workers_cannot_import() -> Any:
    # What a function of a notebook (or `python -c`) is to the spawned workers: pickled by
    # reference to a module they cannot import. Pickling succeeds here, unpickling fails there.
    module = types.ModuleType("turnout_unimportable_processors")
    exec("def boost(ids, logits):\n    logits[7] += 5.0\n    return logits\n", module.__dict__)
    sys.modules[module.__name__] = module
    return module.boost


def test_a_processor_the_workers_cannot_import_is_rejected_alone(llama_dir: Path) -> None:
    # It passed the picklability check, then rank 1 failed unpickling the step: every request
    # was lost and the engine stopped.
    llm = LLM(llama_dir, device="cpu", environ={}, max_model_len=128, tensor_parallel_size=2)
    try:
        good = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        bad = SamplingParams(
            max_tokens=4,
            temperature=0,
            logits_processors=[_processor_of_a_module_the_workers_cannot_import()],
        )
        outs = llm.generate([[5, 6], [7, 8], [9, 10]], [good, bad, good])
        assert outs[1].error is not None and "turnout_unimportable_processors" in outs[1].error
        assert [len(o.outputs[0].token_ids) for o in (outs[0], outs[2])] == [4, 4]
        assert outs[0].error is None and outs[2].error is None
        (again,) = llm.generate([[5, 6]], good)  # the engine is still up
        assert again.outputs[0].token_ids == outs[0].outputs[0].token_ids
    finally:
        llm.shutdown()


def test_shutdown_stops_the_workers_and_one_group_per_process(llama_dir: Path) -> None:
    import torch

    threads = torch.get_num_threads()
    llm = LLM(llama_dir, device="cpu", environ={}, max_model_len=128, tensor_parallel_size=2)
    # On CPU rank 0 computes on its share of the threads too (it kept all of them: 4 threads
    # on 2 cores at TP=3), and gets them back at shutdown.
    assert torch.get_num_threads() == max(1, threads // 2)
    pids = list(llm.core.runner.worker_pids.values())
    (out,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4 and out.error is None
    with pytest.raises(EngineConfigError, match=r"already holds a torch\.distributed group"):
        LLM(llama_dir, device="cpu", environ={}, max_model_len=128, tensor_parallel_size=2)
    llm.shutdown()
    llm.shutdown()  # idempotent
    _assert_no_worker_left(pids)
    assert torch.get_num_threads() == threads
    with pytest.raises(EngineError, match="was shut down"):
        llm.generate([[5, 6, 7]])
