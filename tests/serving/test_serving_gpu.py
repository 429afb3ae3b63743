"""On a GPU: the serving benchmark against real ``turnout engine serve`` processes at
concurrency 1 and 64 on both runners (random Qwen3-0.6B weights from the real config, as the
throughput benchmark's), every request answered in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "policies/reference/model_configs/qwen3-0.6b.json"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from turnout.engine.model import write_random_weights

    config = json.loads(QWEN3.read_text())["config"]
    return write_random_weights(config, tmp_path_factory.mktemp("qwen3"), dtype=torch.bfloat16)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_serving_benchmark_at_concurrency_1_and_64(
    model_dir: Path, runner: str, tmp_path: Path
) -> None:
    cmd = [
        sys.executable, str(ROOT / "benchmarks/serving.py"), "--model", str(model_dir),
        "--runner", runner, "--num-prompts", "256", "--input-len", "256", "--output-len", "32",
        "--max-concurrency", "1,64", "--max-num-seqs", "64", "--max-model-len", "512",
        "--log", str(tmp_path / "server.log"),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ.copy())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["max_concurrency"] for r in result["served"]] == [1, 64]
    for r in result["served"]:
        assert r["runner"] == runner and r["num_errors"] == 0, r
        assert r["output_tok_s"] > 0 and r["ttft_ms"]["p50"] is not None
    assert result["server_exit"] == 0
