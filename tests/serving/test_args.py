"""The flags of ``turnout engine serve`` are vLLM's names, refused as ``vllm serve`` refuses
them (argparse, exit status 2, the flag named)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from turnout.serving.args import parse_args


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from turnout.oracle.cli import main; main()",
            "engine",
            "serve",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_vllm_flag_names_map_to_engine_fields(tmp_path: Path) -> None:
    args = parse_args(
        [
            str(tmp_path),
            "--max-num-seqs",
            "8",
            "--max-model-len",
            "128",
            "--dtype",
            "half",
            "--enforce-eager",
            "--served-model-name",
            "a",
            "b",
            "--shutdown-timeout",
            "7",
            "--api-key",
            "k1",
            "k2",
            "--max-num-queued-reqs",
            "3",
        ]
    )
    assert args.engine_args() == {
        "max_num_seqs": 8,
        "max_model_len": 128,
        "dtype": "float16",
        "enforce_eager": True,
    }
    assert args.served_model_names() == ["a", "b"] and args.drain_timeout == 7.0
    assert args.api_key == ["k1", "k2"] and args.max_num_queued_reqs == 3
    assert parse_args([str(tmp_path)]).served_model_names() == [str(tmp_path)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-num-seq", "8"], "unrecognized arguments: --max-num-seq 8"),
        (["--port", "x"], "argument --port: invalid int value: 'x'"),
        (["--max-num-seqs", "0"], "argument --max-num-seqs: must be at least 1, got 0"),
        (["--runner", "v3"], "argument --runner: invalid choice: 'v3'"),
        (["--drain-timeout", "-1"], "argument --drain-timeout/--shutdown-timeout"),
        (["--dtype", "fp4"], "argument --dtype: invalid choice: 'fp4'"),
        (["--advertise-address", "h:0"], "--advertise-address: address 'h:0': the port must be"),
        (["--advertise-address", "[zz]:80"], "'[zz]:80' is not HOST:PORT"),
        (["--advertise-address", "0.0.0.0:8001"], "every interface is no address to scrape"),
    ],
)
def test_a_bad_flag_is_named_and_exits_2(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args([str(tmp_path), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_command_refuses_a_bad_flag_before_loading_anything(tmp_path: Path) -> None:
    done = run(str(tmp_path), "--max-num-seq", "8")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "turnout engine serve: error: unrecognized arguments: --max-num-seq 8" in done.stderr


def test_a_missing_model_is_named(tmp_path: Path) -> None:
    done = run(str(tmp_path / "nope.gguf"))
    assert done.returncode == 2 and "nope.gguf: no such file or directory" in done.stderr


def test_a_model_that_cannot_load_exits_3_with_the_reason(tmp_path: Path) -> None:
    """The load fails in the engine-core process (the default placement): the server says
    why and exits 3."""
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    done = run(str(bad), "--port", "0", "--uvicorn-log-level", "warning")
    assert done.returncode == 3, done.stderr
    assert "the model failed to load" in done.stderr and str(bad) in done.stderr


def test_dtype_auto_is_vllms_rule_on_a_gpu_and_float32_on_the_cpu(tmp_path: Path) -> None:
    import json

    from serving_helpers import MINILM

    from turnout.serving.startup import auto_dtype

    assert auto_dtype(MINILM, "cuda") == "bfloat16"  # no torch_dtype: float32, downcast
    assert auto_dtype(MINILM, "cpu") is None  # the engine's float32
    config = json.loads((MINILM / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16"}))
    assert auto_dtype(tmp_path, "cuda") == "float16"  # the checkpoint's own half type
