"""benchmarks/throughput.py's command line and contender switches (CPU, nothing is run)."""

from __future__ import annotations

import sys

import pytest

from benchmarks import throughput
from turnout.kernels.paged_attention import set_overlapped_launches


def test_every_contender_is_accepted() -> None:
    args = throughput.parse_args(
        ["--runners", ",".join(throughput.CONTENDERS)], cuda_available=True
    )
    assert args.runners.split(",") == list(throughput.CONTENDERS)


def test_the_full_workload_without_cuda_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Without CUDA it ran the Qwen3-0.6B workload on the CPU without a word: hours.
    with pytest.raises(SystemExit) as exc:
        throughput.parse_args([], cuda_available=False)
    assert exc.value.code == 2
    assert "no CUDA device" in (err := capsys.readouterr().err) and "pass --quick" in err
    assert throughput.parse_args(["--quick"], cuda_available=False).num_prompts == 12


def test_the_help_gives_each_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        throughput.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in (
        "(default: v1,v2,hf)",
        "(default: 1024)",
        "(default: 512)",
        "(default: 128)",
        "(default: 256)",
        "(default: 8192)",
        "(default: bfloat16)",
        "(default: 0)",
    ):
        assert default in out, default
    assert "(default: None)" not in out


def test_a_missing_library_is_one_line_and_a_real_failure_its_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for exc in (ModuleNotFoundError("No module named 'transformers'"), ValueError("a real bug")):
        try:
            raise exc
        except Exception as caught:
            throughput.print_failure(caught)
    err = capsys.readouterr().err
    assert err.count("Traceback") == 1 and "ValueError: a real bug" in err
    assert "transformers" not in err


def test_hf_without_transformers_reports_the_error_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an install without it does
    summary = throughput.main(["--quick", "--runners", "hf"])
    assert summary["results"]["hf_generate"]["error"].startswith("ModuleNotFoundError")
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "hf_generate: {'error': 'ModuleNotFoundError" in out


@pytest.mark.parametrize("runners", ["v3", "v2,v2-fast", "v1,", ""])
def test_an_unknown_contender_is_named_as_argparse_names_a_bad_flag(
    runners: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        throughput.parse_args(["--runners", runners])
    assert exc.value.code == 2
    assert "argument --runners: invalid choice" in capsys.readouterr().err


def test_serial_attention_switches_the_overlap_off_and_back() -> None:
    with throughput.serial_attention():
        assert set_overlapped_launches(False) is False  # off inside
    assert set_overlapped_launches(True) is True  # on again after


@pytest.mark.parametrize("runners", ["v2,v2", "v2,v2-serial,v2"])
def test_a_contender_named_twice_is_refused(
    runners: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Results are keyed by contender: a second run of one replaced the first's numbers in the
    # summary (an A/B/A order check kept only the last A) after running it twice.
    with pytest.raises(SystemExit) as exc:
        throughput.parse_args(["--runners", runners])
    assert exc.value.code == 2
    assert "argument --runners: 'v2' named twice" in capsys.readouterr().err
