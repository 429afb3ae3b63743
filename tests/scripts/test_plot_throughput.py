"""scripts/plot_throughput.py: it finds the benchmark's summary in a log and draws one bar per
contender (the drawing needs matplotlib, the `plots` extra)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "plot_throughput.py"
spec = importlib.util.spec_from_file_location("plot_throughput", SCRIPT)
assert spec is not None and spec.loader is not None
plot_throughput = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_throughput)

SUMMARY = {
    "benchmark": "throughput",
    "model": "m",
    "num_prompts": 4,
    "output_len": 8,
    "device": "cpu",
    "results": {
        "runner_v1": {"output_tokens_per_s": 10.0},
        "runner_v2": {"output_tokens_per_s": 20.0},
        "hf_generate": {"error": "RuntimeError: x"},
    },
    "bandwidth_floor": {"output_tokens_per_s": 50.0},
}


def test_the_summary_is_the_last_json_line_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "throughput.log"
    log.write_text("running runner_v1 ...\n{'not': json}\n" + json.dumps(SUMMARY) + "\n")
    assert plot_throughput.load_summary(log) == SUMMARY
    log.write_text("running runner_v1 ...\n")
    with pytest.raises(SystemExit, match="no line is a JSON object"):
        plot_throughput.load_summary(log)


def test_draws_a_png_of_the_contenders_that_ran(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    plot_throughput.plot(SUMMARY, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_summary_with_nothing_to_draw_is_refused_before_any_file_is_written(
    tmp_path: Path,
) -> None:
    # An all-errored run once drew an empty chart over the docs' image (the default output).
    out = tmp_path / "t.png"
    errored = {**SUMMARY, "results": {"runner_v2": {"error": "RuntimeError: CUDA out of memory"}}}
    with pytest.raises(
        SystemExit, match=r"no contender ran.*runner_v2: RuntimeError: CUDA out of memory"
    ):
        plot_throughput.plot(errored, out)
    with pytest.raises(SystemExit, match="no 'results' object"):
        plot_throughput.plot({"benchmark": "throughput"}, out)
    assert not out.exists()
    with pytest.raises(SystemExit, match="cannot read"):
        plot_throughput.load_summary(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(SystemExit, match="no line is a JSON object"):
        plot_throughput.load_summary(tmp_path / "empty.json")
    (tmp_path / "cut.json").write_text(json.dumps(SUMMARY)[:40])
    with pytest.raises(SystemExit, match="no line is a JSON object"):
        plot_throughput.load_summary(tmp_path / "cut.json")
