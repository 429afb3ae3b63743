"""benchmarks/throughput.py's command line and contender switches (CPU, nothing is run)."""

from __future__ import annotations

import pytest

from benchmarks import throughput
from kernels.paged_attention import set_overlapped_launches


def test_every_contender_is_accepted() -> None:
    args = throughput.parse_args(["--runners", ",".join(throughput.CONTENDERS)])
    assert args.runners.split(",") == list(throughput.CONTENDERS)


@pytest.mark.parametrize("runners", ["v3", "v2,v2-fast", "v1,", ""])
def test_an_unknown_contender_is_named_as_argparse_names_a_bad_flag(
        runners: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        throughput.parse_args(["--runners", runners])
    assert exc.value.code == 2
    assert "argument --runners: invalid choice" in capsys.readouterr().err


def test_serial_attention_switches_the_overlap_off_and_back() -> None:
    with throughput.serial_attention():
        assert set_overlapped_launches(False) is False  # off inside
    assert set_overlapped_launches(True) is True  # on again after


@pytest.mark.parametrize("runners", ["v2,v2", "v2,v2-serial,v2"])
def test_a_contender_named_twice_is_refused(runners: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Results are keyed by contender: a second run of one replaced the first's numbers in the
    # summary (an A/B/A order check kept only the last A) after running it twice.
    with pytest.raises(SystemExit) as exc:
        throughput.parse_args(["--runners", runners])
    assert exc.value.code == 2
    assert "argument --runners: 'v2' named twice" in capsys.readouterr().err
