"""benchmarks/tensor_parallel.py's CPU parts: it imports without a GPU, compares greedy tokens
as it says, and its --quick run (gloo, a tiny shape of the Llama-3.1-8B config) ends with one
JSON object whose TP=2 tokens equal TP=1's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location(
        "tensor_parallel_bench", ROOT / "benchmarks" / "tensor_parallel.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_greedy_agreement_names_the_first_difference(bench: Any) -> None:
    got = bench.greedy_agreement([[1, 2, 3], [1, 2, 3], [4, 5]], [[1, 2, 3], [1, 9, 3], [4]])
    assert got == {"equal": 1, "of": 3, "first_difference": [None, 1, 1]}


def test_the_shape_is_llama_3_1_8b(bench: Any) -> None:
    config = bench.model_config(quick=False)
    assert (
        config["architectures"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    ) == (["LlamaForCausalLM"], 32, 8)
    quick = bench.model_config(quick=True)
    assert quick["rope_scaling"] == config["rope_scaling"] and quick["num_attention_heads"] % 2 == 0


@pytest.mark.slow
def test_quick_run_prints_one_json_object(bench: Any, capsys: pytest.CaptureFixture[str]) -> None:
    result = bench.main(["--quick", "--runners", "v1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == result
    v1 = result["runners"]["v1"]
    assert (
        v1["greedy_tokens_equal"] and v1["tp2"]["output_tokens"] == v1["tp1"]["output_tokens"] == 24
    )
    assert result["nccl_nvls_enable"] == "0"
