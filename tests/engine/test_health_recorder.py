"""engine/health.py on its own: what a window's report says (TTFT, TPOT, errors, tokens over the
seconds spent stepping), on a clock the test moves; the run marker that tells a crash from a
clean end, with real processes holding and losing it."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from turnout.engine.health import HealthRecorder, RunMarker, percentile

T0 = dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> dt.datetime:
        return T0 + dt.timedelta(seconds=self.t - 100.0)


def _recorder(clock: Clock, **kw: object) -> HealthRecorder:
    return HealthRecorder(
        deployment_id="d",
        runner="v2",
        family="llama",
        stage="s",
        clock=clock,
        wall=clock.wall,
        **kw,
    )  # type: ignore[arg-type]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([7.0], 0.99) == 7.0


def test_a_window_reports_ttft_tpot_errors_and_tokens_per_busy_second() -> None:
    clock = Clock()
    rec = _recorder(clock)
    with rec.running():
        rec.queued("a")
        rec.queued("b")
        rec.queued("c")
        clock.t += 0.2  # a step: a and b get their first token
        rec.observe([("a", 1), ("b", 1), ("c", 0)])
        clock.t += 0.1
        rec.observe([("a", 2), ("b", 2), ("c", 1)])  # c's first token at 0.3 s
        rec.finished("b", failed=True)
        clock.t += 0.1
        rec.observe([("a", 5), ("c", 1)])
        rec.finished("a", failed=False)
        rec.finished("c", failed=False)  # one token: a TTFT, no TPOT
    clock.t += 10.0  # idle: not generating, so not in tokens/s
    report = rec.cut()
    assert report["window_start"] == T0 and report["window_end"] == clock.wall()
    assert (report["num_requests"], report["num_errors"], report["num_crashes"]) == (3, 1, 0)
    assert report["ttft_p50_ms"] == pytest.approx(200.0)
    assert report["ttft_p99_ms"] == pytest.approx(300.0)
    # b: 1 token after the first in 0.1 s; a: 4 tokens after the first in 0.2 s
    assert report["tpot_p50_ms"] == pytest.approx(50.0)
    assert report["tpot_p99_ms"] == pytest.approx(100.0)
    assert report["num_output_tokens"] == 5 + 2 + 1
    assert report["output_tokens_per_s"] == pytest.approx(8 / 0.4)
    assert {k: report[k] for k in ("deployment_id", "runner", "family", "stage")} == {
        "deployment_id": "d",
        "runner": "v2",
        "family": "llama",
        "stage": "s",
    }


def test_the_next_window_starts_empty_and_a_crash_is_reported_once() -> None:
    clock = Clock()
    rec = _recorder(clock, num_crashes=1)
    clock.t += 60
    first = rec.cut()
    clock.t += 60
    second = rec.cut()
    assert (first["num_crashes"], second["num_crashes"]) == (1, 0)
    assert second["window_start"] == first["window_end"]
    assert second["num_requests"] == 0 and second["ttft_p99_ms"] is None
    assert second["output_tokens_per_s"] == 0.0
    assert rec.cut()["window_end"] > second["window_end"]  # never an empty window


def test_a_cut_while_stepping_splits_the_busy_time_and_a_request_spans_windows() -> None:
    clock = Clock()
    rec = _recorder(clock)
    with rec.running():
        rec.queued("a")
        clock.t += 1.0
        rec.observe([("a", 10)])
        first = rec.cut()  # 10 tokens in the 1 s so far
        clock.t += 1.0
        rec.observe([("a", 30)])
        rec.finished("a", failed=False)
    second = rec.cut()
    assert (first["num_output_tokens"], first["output_tokens_per_s"]) == (10, 10.0)
    assert (first["num_requests"], first["ttft_p99_ms"]) == (0, 1000.0)  # TTFT when it came
    assert (second["num_output_tokens"], second["output_tokens_per_s"]) == (20, 20.0)
    assert second["num_requests"] == 1 and second["tpot_p99_ms"] == pytest.approx(1000 / 29)


def test_a_window_longer_than_a_day_still_gives_a_report_the_service_takes() -> None:
    """Cut after two days of stepping (a health interval over a day): the window is cut to
    the day the service takes, and the busy time with it, so that tokens over their rate (the
    time spent generating) fit in the window; the report would be refused, and dropped with
    its requests and crashes, otherwise."""
    from turnout.oracle.wire import HealthReportIn

    clock = Clock()
    rec = _recorder(clock, num_crashes=1)
    with rec.running():
        rec.queued("a")
        clock.t += 2 * 86_400.0
        rec.observe([("a", 400_000)])
        rec.finished("a", failed=False)
    report = rec.cut()
    assert report["window_end"] - report["window_start"] == dt.timedelta(days=1)
    checked = HealthReportIn.model_validate({**report, "report_id": "r", "pack": "turnout"})
    assert (checked.num_requests, checked.num_crashes) == (1, 1)
    assert checked.output_tokens_per_s == pytest.approx(400_000 / 86_400)


def test_a_failed_step_counts_every_queued_request_as_an_error() -> None:
    clock = Clock()
    rec = _recorder(clock)
    for r in ("a", "b"):
        rec.queued(r)
    rec.finished("a", failed=False)
    rec.failed_all()
    rec.finished("zz", failed=True)  # never queued: ignored
    report = rec.cut()
    assert (report["num_requests"], report["num_errors"]) == (2, 1)


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from turnout.engine.health import RunMarker
    marker = RunMarker.acquire(Path(sys.argv[1]), "prod/llama")
    print("held", marker.held, marker.crashed, flush=True)
    if sys.argv[2] == "clean":
        marker.release()
        print("released", flush=True)
    time.sleep(120)
""")


def _hold(directory: Path, how: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), how], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip()]
    if how == "clean":
        lines.append(proc.stdout.readline().strip())
    return proc, lines


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_a_run_that_was_killed_is_told_by_the_next_start(tmp_path: Path) -> None:
    proc, lines = _hold(tmp_path, "run")
    assert lines == ["held True False"]
    live = RunMarker.acquire(tmp_path, "prod/llama")
    assert not live.held and not live.crashed  # another live engine of the deployment holds it
    _kill(proc)
    after = RunMarker.acquire(tmp_path, "prod/llama")
    assert after.held and after.crashed
    after.release()
    assert not RunMarker.acquire(tmp_path, "prod/llama").crashed  # that run ended cleanly


def test_a_run_that_ended_cleanly_is_no_crash_even_if_killed_afterwards(tmp_path: Path) -> None:
    proc, lines = _hold(tmp_path, "clean")
    assert lines == ["held True False", "released"]
    _kill(proc)
    marker = RunMarker.acquire(tmp_path, "prod/llama")
    assert marker.held and not marker.crashed
    other = RunMarker.acquire(tmp_path, "prod/qwen")  # another deployment: its own marker
    assert other.held and not other.crashed
    marker.release()
    other.release()
    marker.release()  # idempotent


def test_a_crash_is_told_with_the_runner_of_the_run_that_crashed(tmp_path: Path) -> None:
    first = RunMarker.acquire(tmp_path, "prod/llama", runner="v1")
    assert first.path.read_text().startswith(f"running {os.getpid()} v1 prod/llama")
    os.close(first._fd)  # type: ignore[arg-type]  # the run dies: its lock goes, "running" stays
    first._fd = None
    again = RunMarker.acquire(tmp_path, "prod/llama", runner="v2")
    assert (again.crashed, again.crashed_runner) == (True, "v1")
    again.release()
    # a marker written before runners were: a crash whose runner is not known
    again.path.write_text("running 12 prod/llama\n")
    old = RunMarker.acquire(tmp_path, "prod/llama", runner="v2")
    assert (old.crashed, old.crashed_runner) == (True, None)
    old.release()
