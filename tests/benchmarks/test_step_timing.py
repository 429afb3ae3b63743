"""benchmarks/step_timing.py on CPU: its summary statistics, and drive() over a real engine
(runner_v1 and runner_v2, tiny model) charging every applied step once, with the finished requests it
returns equal to run_until_done()'s."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from benchmarks.step_timing import drive, gc_time, summarize
from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput


def test_summary_by_kind_and_transition() -> None:
    steps = [
        ("decode", "decode", 0.004, 0.001),
        ("decode", "mixed", 0.006, 0.002),
        ("mixed", "decode", 0.020, 0.015),
        ("decode", "decode", 0.010, 0.003),
    ]
    out = summarize(steps, {"gen0_collections": 2.0})
    assert out["decode"]["steps"] == 3 and out["decode"]["ms_per_step"] == pytest.approx(6.67)
    assert (
        out["decode"]["p50_ms"] == 6.0
        and out["decode"]["p90_ms"] == 10.0
        and out["decode"]["max_ms"] == 10.0
    )
    assert out["decode"]["wait_ms_per_step"] == 2.0 and out["decode"][
        "host_ms_per_step"
    ] == pytest.approx(4.67)
    assert out["mixed"]["steps"] == 1
    assert set(out["transitions"]) == {"decode <- decode", "decode <- mixed", "mixed <- decode"}
    assert out["transitions"]["decode <- decode"]["steps"] == 2
    assert out["gc"] == {"gen0_collections": 2.0}


def test_synchronous_steps_have_no_wait_figures() -> None:
    out = summarize([("mixed", "mixed", 0.002, None)], {})
    assert "wait_ms_per_step" not in out["mixed"] and out["mixed"]["p90_ms"] == 2.0


def test_gc_time_counts_collections() -> None:
    with gc_time() as totals:
        gc.collect()
    assert totals["gen2_collections"] >= 1 and totals["gen2_seconds"] >= 0


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_drive_charges_every_step_once(runner: str, tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS["llama"], tmp_path, dtype=torch.float32, seed=2)
    core = build_engine_core(
        engine_config_for(
            tmp_path,
            max_model_len=64,
            max_num_seqs=4,
            max_num_batched_tokens=16,
            kv_cache_memory_gb=0.01,
        ),
        runner,
    )
    for i in range(6):
        core.add_request(
            f"r{i}",
            [3 + i] * (5 + 3 * i),
            SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
        )
    done, summary = drive(core)
    assert sorted(r.req_id for r in done) == [f"r{i}" for i in range(6)]
    kinds = {k: v for k, v in summary.items() if k in ("decode", "mixed")}
    assert sum(v["steps"] for v in kinds.values()) == core.num_steps
    assert sum(v["steps"] for v in summary["transitions"].values()) == core.num_steps
    assert core.runner.execute_model.__func__ is type(core.runner).execute_model  # unwrapped again
    # runner_v2 collects each step one call later, through AsyncOutput: its waits are reported
    assert all(("wait_ms_per_step" in v) == (runner == "v2") for v in kinds.values())


class _FakeRunner:
    def __init__(self, fail_at: int | None = None) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def execute_model(self, so: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("step failed")
        return so


class _FakeCore:
    """A synchronous engine over a fixed list of scheduler outputs."""

    async_scheduling = False

    def __init__(self, outputs: list[SchedulerOutput], runner: _FakeRunner) -> None:
        self.outputs, self.runner = list(outputs), runner

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs)

    def step(self) -> list[Any]:
        self.runner.execute_model(self.outputs.pop(0))
        return []


def _so(tokens: dict[str, int], drafts: dict[str, list[int]] | None = None) -> SchedulerOutput:
    return SchedulerOutput(
        num_scheduled_tokens=tokens,
        total_num_scheduled_tokens=sum(tokens.values()),
        scheduled_spec_decode_tokens=drafts or {},
    )


def test_a_failing_step_leaves_nothing_patched() -> None:
    import turnout.runner_v2.async_output as async_output

    runner = _FakeRunner(fail_at=2)
    get_output, callbacks = async_output.AsyncOutput.get_output, list(gc.callbacks)
    with pytest.raises(RuntimeError, match="step failed"):
        drive(_FakeCore([_so({"a": 1})] * 3, runner))
    assert (
        "execute_model" not in vars(runner)
        and runner.execute_model.__func__ is _FakeRunner.execute_model
    )
    assert async_output.AsyncOutput.get_output is get_output and gc.callbacks == callbacks


def test_a_wrapper_already_on_the_runner_is_put_back() -> None:
    runner = _FakeRunner()
    seen: list[Any] = []
    original = runner.execute_model

    def wrapper(so: Any) -> Any:  # another tool's timer, installed before drive()
        seen.append(so)
        return original(so)

    runner.execute_model = wrapper  # type: ignore[method-assign]
    drive(_FakeCore([_so({"a": 1})], runner))
    assert runner.execute_model is wrapper and len(seen) == 1  # it was dropped, not restored


def test_speculative_decodes_are_decodes() -> None:
    # Two requests verifying 3 drafts each schedule 8 tokens, no prompt token among them.
    outputs = [
        _so({"a": 4, "b": 4}, {"a": [1, 2, 3], "b": [4, 5, 6]}),
        _so({"a": 4, "c": 5}, {"a": [1, 2, 3]}),
    ]
    _, summary = drive(_FakeCore(outputs, _FakeRunner()))
    assert summary["decode"]["steps"] == 1 and summary["mixed"]["steps"] == 1


def test_host_gap_phases_time_every_phase_and_leave_nothing_patched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # benchmarks/host_gap.py's phase timers over runner_v2 on CPU (no device to synchronise).
    import benchmarks.host_gap as host_gap
    import turnout.runner_v2.async_output as async_output
    import turnout.runner_v2.runner as runner_mod

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    write_random_weights(TINY_DECODER_CONFIGS["llama"], tmp_path, dtype=torch.float32, seed=2)
    core = build_engine_core(
        engine_config_for(tmp_path, max_model_len=64, max_num_seqs=2, kv_cache_memory_gb=0.01), "v2"
    )
    for i in range(2):
        core.add_request(
            f"r{i}", [3, 4, 5], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
        )
    core.step()
    get_output, upload = async_output.AsyncOutput.get_output, runner_mod.upload_step
    out = host_gap.phases(core, 3)
    phases = out["us_per_step"]
    for name in (
        "schedule",
        "execute_model",
        "execute_model.prepare",
        "execute_model.sample",
        "wait_for_results",
        "assemble_output",
        "update_from_output",
        "loop_and_rest",
    ):
        assert name in phases, name
    assert phases["execute_model"] >= phases["execute_model.prepare"] > 0
    assert async_output.AsyncOutput.get_output is get_output and runner_mod.upload_step is upload
    assert "execute_model" not in vars(core.runner) and "schedule" not in vars(core.scheduler)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--num-reqs", "0", "must be at least 1, got 0"),
        ("--num-steps", "x", "invalid int value: 'x'"),
    ],
)
def test_host_gap_names_a_bad_flag(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import benchmarks.host_gap as host_gap

    with pytest.raises(SystemExit) as exc:
        host_gap.main([flag, value])
    assert exc.value.code == 2 and f"argument {flag}: {message}" in capsys.readouterr().err
