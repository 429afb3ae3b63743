"""Rich output on a pipe or a file (CI logs, ``| grep``): nothing is cut with an ellipsis, and
each row of a table stays on one line; a narrow COLUMNS wraps cells instead of cutting them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from turnout.oracle.cli import app

LONG_ID = "deployment-with-a-rather-long-identifier-0001"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
# A V2 blocker whose removal still leaves Llama's stage (off) to pass: two long suggestions.
OFFLOAD = ["--cpu-offload-gb", "4"]
SUGGESTIONS = [
    "→ V2 (config+pin, STATIC): cpu_offload_gb 4.0 → 0; env:TURNOUT_USE_V2_MODEL_RUNNER unset → 1",
    "→ V2 (config+canary, TARGETING_MATCH): cpu_offload_gb 4.0 → 0; "
    "canary:llama-mistral-dense off → on 100%",
]


def _invoke(*args: str, columns: str | None = None, codes: tuple[int, ...] = (0, 2)) -> str:
    # CliRunner captures stdout in a buffer: not a terminal, like a pipe.
    result = CliRunner(env={"COLUMNS": columns}).invoke(app, list(args))
    assert result.exit_code in codes, result.output
    return result.output


@pytest.fixture
def commands(tmp_path: Path) -> Path:
    lines = [
        {"id": LONG_ID, "env": {}, "argv": ["vllm", "serve", MODEL, "--speculative-config", NGRAM]},
        {"id": "placeholder-line", "env": {}, "argv": ["vllm", "serve", "<checkpoint>"]},
    ]
    path = tmp_path / "commands.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_table_on_a_pipe_keeps_ids_and_reasons_whole_on_one_line(commands: Path) -> None:
    out = _invoke("decide", "--commands", str(commands))
    assert "…" not in out
    row = next(line for line in out.splitlines() if LONG_ID in line)
    assert MODEL in row and "speculative method 'ngram'" in row
    bad = next(line for line in out.splitlines() if "placeholder-line" in line)
    assert (
        "the model '<checkpoint>' is a placeholder, not a model id; pass --architecture "
        "ARCH or --config path/to/config.json"
    ) in bad


def test_explain_on_a_pipe_prints_each_suggestion_on_one_line() -> None:
    out = _invoke("explain", "--", "vllm", "serve", MODEL, *OFFLOAD)
    lines = [line.strip() for line in out.splitlines() if "→ V2" in line]
    assert lines == SUGGESTIONS
    assert (
        "Model Runner V2 does not yet support CPU weight offload (cpu_offload_gb > 0); using "
        "the V1 model runner instead."
    ) in out


def test_matrix_and_summary_on_a_pipe_are_not_cut(commands: Path) -> None:
    out = _invoke("matrix")
    assert "…" not in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert rows and all(row.split("│")[1].strip() for row in rows)  # no continuation lines
    out = _invoke("decide", "--commands", str(commands), "--summary")
    assert "…" not in out and "placeholder_model (1)" in out


def test_a_narrow_columns_wraps_cells_instead_of_cutting_them(commands: Path) -> None:
    out = _invoke("decide", "--commands", str(commands), columns="60")
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 60
    # The id is folded over lines of its cell, every character kept.
    cells = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert LONG_ID in "".join(cells)


def test_values_in_square_brackets_are_printed_not_taken_as_styles(tmp_path: Path) -> None:
    # Rich reads "[word]" as markup: a logits processor, a model id or an error that holds
    # one lost it silently ("logits_processors  → []").
    out = _invoke(
        "explain",
        "--architecture",
        "Qwen3ForCausalLM",
        "--set",
        'logits_processors=["example_pkg.procs:BanTokens"]',
    )
    assert "logits_processors [example_pkg.procs:BanTokens] → []" in out
    assert "logits_processors=('example_pkg.procs:BanTokens',)" in out  # the reasons table
    diff = _invoke("matrix", "--diff", "vllm-0.31", codes=(1,))  # cells change: exit 1
    assert "logits_processors=[example_pkg.procs:BanTokens]" in diff
    path = tmp_path / "commands.jsonl"
    path.write_text(
        json.dumps({"id": "[bold]x", "env": {}, "argv": ["vllm", "serve", "org/[red]model"]}) + "\n"
    )
    out = _invoke("decide", "--commands", str(path))
    assert "[bold]x" in out and "org/[red]model" in out
    out = _invoke("decide", "--", "vllm", "serve", "org/[red]model")
    assert "model 'org/[red]model' is not in" in out


@pytest.mark.parametrize("columns", ["0", "00"])
def test_a_zero_columns_is_ignored_not_taken_as_no_room(columns: str) -> None:
    # Rich took COLUMNS=0 as a width of 0 and printed nothing: turnout decide exited 2 with
    # no word of why.
    out = _invoke("decide", "--architecture", "NoSuchForCausalLM", columns=columns)
    assert "unknown architecture 'NoSuchForCausalLM'" in out
    result = CliRunner(env={"COLUMNS": columns}).invoke(
        app, ["explain", "--", "vllm", "serve", MODEL, *OFFLOAD]
    )
    assert [line.strip() for line in result.output.splitlines() if "→ V2" in line] == SUGGESTIONS


def test_an_80_column_decision_keeps_matched_values_whole_and_indents_wrapped_messages() -> None:
    # At 80 columns the closing quote of 'ngram' was folded onto a line of its own, and the
    # second line of the WARNING started at column 0.
    out = _invoke(
        "decide",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--speculative-config",
        NGRAM,
        columns="80",
    )
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.rstrip().endswith("speculative_method='ngram'") for line in lines), out
    assert not any(line.strip() == "'" for line in lines), out
    warning = next(i for i, line in enumerate(lines) if line.startswith("  WARNING "))
    assert lines[warning + 1].startswith(" " * len("  WARNING ")), out
    out = _invoke("explain", "--", "vllm", "serve", MODEL, *OFFLOAD, columns="60")
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if "→ V2" in line)
    assert lines[first + 1].startswith(" " * len("  → V2 ")), out
