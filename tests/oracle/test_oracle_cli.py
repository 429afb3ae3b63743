"""The `turnout` CLI: exit codes and the machine-readable contract (JSON lines)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from turnout.oracle.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "policies" / "reference"


def turnout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_decide_command_line_json() -> None:
    r = turnout("decide", "--json", "--", "vllm", "serve", "Qwen/Qwen3-8B", "-tp", "2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["runner"] == "v2" and out["mode"] == "auto" and out["family"] == "qwen3"
    assert out["messages"] == [{"level": "INFO", "message": "Using V2 Model Runner"}]
    assert out["error"] is None and len(out["policy_digest"]) == 16
    assert set(out) >= {"runner", "mode", "family", "reasons", "messages", "error", "policy_digest"}


def test_pin_that_cannot_be_honoured_exits_3() -> None:
    r = turnout(
        "decide",
        "--json",
        "--env",
        "TURNOUT_USE_V2_MODEL_RUNNER=1",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--speculative-config",
        '{"method": "ngram"}',
    )
    assert r.returncode == 3
    out = json.loads(r.stdout)
    assert out["runner"] is None
    assert out["error"] == "Model Runner V2 does not yet support: speculative method 'ngram'"
    assert [x["rule_id"] for x in out["reasons"]] == ["pin.v2", "ngram_speculation"]


def test_decide_help_says_what_exit_3_and_a_commands_file_are() -> None:
    """The help said exit 3 was "a pin that cannot be honoured", yet an architecture no runner
    of this build serves exits 3 with no pin at all; and it gave --commands as JSON lines only,
    though a shell line is read too (README.md's upgrade section feeds a fleet of them)."""
    r = turnout("decide", "--json", "--architecture", "Mamba2ForCausalLM")
    assert r.returncode == 3, r.stderr
    assert json.loads(r.stdout)["error_code"] == "architecture_not_served"
    help_text = subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", "decide", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "400"},
    ).stdout
    assert (
        "3 no runner can serve it (a pin that cannot be honoured, an architecture no runner "
        "of this build serves)"
    ) in help_text
    assert "or a shell line (NAME=value ... vllm serve MODEL ...)" in help_text


def test_a_pin_reports_the_value_it_was_set_to() -> None:
    """vLLM reads its runner variable as an int, so 2 pins V2 too: the matched values and the
    label say "2" as set, not the "1" a pin to V2 would usually read (the same config pinned
    with "1" first, so a cached plan for "1" cannot answer for "2")."""
    line = ["--", "vllm", "serve", "Qwen/Qwen3-8B"]
    for value in ("1", "2"):
        r = turnout(
            "decide",
            "--pack",
            "vllm-0.31",
            "--env",
            f"VLLM_USE_V2_MODEL_RUNNER={value}",
            "--json",
            *line,
        )
        assert r.returncode == 0, r.stderr
        (reason,) = json.loads(r.stdout)["reasons"]
        assert reason["matched"] == {"VLLM_USE_V2_MODEL_RUNNER": value}
        assert reason["label"] == f"pinned to V2 by VLLM_USE_V2_MODEL_RUNNER={value}"
    r = turnout("decide", "--pack", "vllm-0.31", "--env", "VLLM_USE_V2_MODEL_RUNNER=2", *line)
    assert "VLLM_USE_V2_MODEL_RUNNER='2'" in r.stdout and "=1" not in r.stdout, r.stdout


def test_pinned_plans_are_kept_per_value_of_the_variable() -> None:
    from turnout.oracle import decide, load_pack
    from turnout.oracle.config import DeploymentConfig

    pack = load_pack("vllm-0.31")
    seen = []
    for value in ("1", "2", "1", "3"):
        d = decide(
            DeploymentConfig(
                architecture="Qwen3ForCausalLM", env={"VLLM_USE_V2_MODEL_RUNNER": value}
            ),
            pack=pack,
        )
        seen.append((d.runner, d.reasons[0].matched["VLLM_USE_V2_MODEL_RUNNER"]))
    assert seen == [("v2", "1"), ("v2", "2"), ("v2", "1"), ("v2", "3")]


def test_bad_input_exits_2_with_the_reason() -> None:
    r = turnout("decide", "--", "vllm", "serve", "<checkpoint>")
    assert r.returncode == 2
    assert "placeholder" in r.stdout + r.stderr and "--architecture" in r.stdout + r.stderr


def test_spec_jsonl_one_result_per_line_echoing_id() -> None:
    r = turnout(
        "decide", "--pack", "vllm-0.31", "--spec", str(REF / "vllm031_cases.jsonl"), "--json"
    )
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    cases = [json.loads(x) for x in (REF / "vllm031_cases.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == [c["id"] for c in cases]
    for got, case in zip(lines, cases, strict=True):
        assert (got["runner"] or "error") == case["want"]["decision"]
    assert r.returncode == 2  # env-true-string is bad input (an invalid runner variable)


def test_commands_file_sets_error_per_line(tmp_path: Path) -> None:
    f = tmp_path / "cmds.jsonl"
    f.write_text(
        json.dumps({"id": "ok", "env": {}, "argv": ["vllm", "serve", "Qwen/Qwen3-8B"]})
        + "\n"
        + json.dumps({"id": "bad", "env": {}, "argv": ["vllm", "serve", "$M"]})
        + "\n"
    )
    r = turnout("decide", "--commands", str(f), "--json")
    ok, bad = (json.loads(x) for x in r.stdout.splitlines())
    assert ok["id"] == "ok" and ok["runner"] == "v2" and ok["error"] is None
    assert bad["id"] == "bad" and bad["runner"] is None and "placeholder" in bad["error"]
    assert r.returncode == 2


def test_commands_file_with_odd_shapes_sets_error_per_line(tmp_path: Path) -> None:
    f = tmp_path / "cmds.jsonl"
    good = {"id": "ok", "env": {}, "argv": ["vllm", "serve", "Qwen/Qwen3-8B"]}
    rows = [
        {**good, "id": "env-str", "env": "abc"},
        {**good, "id": "env-list", "env": [1, 2]},
        {**good, "id": "env-null", "env": {"A": None}},
        {**good, "id": "argv-null", "argv": ["vllm", "serve", "Qwen/Qwen3-8B", None]},
        {**good, "id": ["x"]},
        good,
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = turnout("decide", "--commands", str(f), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o.get("id") for o in out] == [
        "env-str",
        "env-list",
        "env-null",
        "argv-null",
        None,
        "ok",
    ]
    assert [o["error"].split(": ", 1)[1].split(":")[0] for o in out[:5]] == [
        "env",
        "env",
        "env",
        "argv",
        "id",
    ]
    assert out[-1]["runner"] == "v2" and out[-1]["error"] is None


@pytest.mark.parametrize("args", [["decide"], ["decide", "--pack", "nope", "--architecture", "X"]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert turnout(*args).returncode == 2


def test_summary_markdown_table() -> None:
    r = turnout("decide", "--commands", str(REF / "vllm_recipes.jsonl"), "--summary", "--markdown")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| family | deployments | V2 | V1 |")
    total = sum(int(line.split("|")[2]) for line in lines[2:] if line.startswith("|"))
    assert total == len((REF / "vllm_recipes.jsonl").read_text().splitlines())
    assert lines[-2:] == [
        "",
        "canaries: rollout.yaml defaults of pack turnout (pass --canaries "
        "FILE, e.g. the service's GET /api/v1/canaries, to decide with the "
        "live ones)",
    ]


def test_the_summary_bad_input_row_counts_every_error_code() -> None:
    """The row showed the three most common codes only, so the six kinds of bad input that
    README.md lists "as --summary shows" could not be read off it: now every code, whose
    counts add up to the row's lines."""
    r = turnout("decide", "--commands", str(REF / "vllm_recipes.jsonl"), "--summary", "--markdown")
    row = next(x for x in r.stdout.splitlines() if x.startswith("| (bad input) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    counts = {code: int(n) for code, n in re.findall(r"(\w+) \((\d+)\)", cells[5])}
    assert len(counts) > 3, row
    assert sum(counts.values()) == int(cells[1]), row


def test_explain_prints_the_suggestions() -> None:
    r = turnout(
        "explain",
        "--architecture",
        "Qwen3ForCausalLM",
        "--set",
        "speculative_method=ngram",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["decision"]["runner"] == "v1"
    assert out["suggestions"][0]["text"] == "speculative_method ngram → ngram_gpu"  # on the device
    r = turnout("explain", "--", "vllm", "serve", "<checkpoint>")
    assert r.returncode == 2 and "placeholder" in r.stdout + r.stderr


def test_explain_combines_a_config_change_with_the_canary() -> None:
    argv = ["--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--cpu-offload-gb", "4"]
    r = turnout("explain", *argv)
    assert r.returncode == 0, r.stderr
    assert "no change of the deployment's options reaches V2" not in r.stdout
    text = " ".join(r.stdout.split())
    assert text.endswith(
        "→ V2 (config+pin, STATIC): cpu_offload_gb 4.0 → 0; "
        "env:TURNOUT_USE_V2_MODEL_RUNNER unset → 1 "
        "→ V2 (config+canary, TARGETING_MATCH): cpu_offload_gb 4.0 → 0; "
        "canary:llama-mistral-dense off → on 100% "
        "canaries: rollout.yaml defaults of pack turnout (pass --canaries FILE, e.g. the "
        "service's GET /api/v1/canaries, to decide with the live ones)"
    )
    out = json.loads(turnout("explain", "--json", *argv).stdout)
    assert [s["kind"] for s in out["suggestions"]] == ["config+pin", "config+canary"]
    assert out["suggestions"][1]["changes"] == [
        {"dimension": "cpu_offload_gb", "from": 4.0, "to": 0},
        {"dimension": "canary:llama-mistral-dense", "from": "off", "to": "on 100%"},
    ]


@pytest.mark.parametrize(
    "args", [["--", "vllm", "serve", "<checkpoint>"], ["--pack", "nope", "--architecture", "X"]]
)
def test_explain_json_on_bad_input_is_still_json(args: list[str]) -> None:
    r = turnout("explain", "--json", *args)
    assert r.returncode == 2
    out = json.loads(r.stdout)  # scripts parse stdout: no text on it
    assert out["suggestions"] == [] and out["decision"]["runner"] is None
    assert out["decision"]["error_code"] in (ErrorCode.PLACEHOLDER_MODEL, ErrorCode.UNKNOWN_PACK)
    assert out["note"] == "fix the input first: " + out["decision"]["error"]


def test_lint_exit_codes(tmp_path: Path) -> None:
    import shutil

    assert turnout("lint", "turnout").returncode == 0
    bad = tmp_path / "pack"
    shutil.copytree(ROOT / "policies" / "turnout", bad)
    cm = bad / "capability_matrix.yaml"
    cm.write_text(cm.read_text().replace("speculative_method: medusa", "speculative_method: x"))
    r = turnout("lint", str(bad))
    assert r.returncode == 1
    assert f"{cm}:" in r.stdout and "unknown value 'x' for speculative_method" in r.stdout


def test_matrix_and_diff_json() -> None:
    r = turnout("matrix", "--pack", "vllm-0.31", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["cells"] > 10_000 and out["families"]["llama"]["runners"]["v2"] > 0
    r = turnout("matrix", "--diff", "vllm-0.31", "--json")
    out = json.loads(r.stdout)
    assert out["from"] == "turnout" and out["to"] == "vllm-0.31" and out["changed_cells"] > 0
    # turnout's runners implement no draft-model speculation (no runner); vLLM 0.31's V2 does.
    assert any(
        g["scenario"] == "speculative_method=draft_model"
        and g["from"] == "refuse"
        and g["to"] == "v2"
        and g["change"] == "refuse→v2"
        for g in out["groups"]
    )


def test_the_plugins_register_once_however_often_main_is_entered() -> None:
    """In-process callers entered main() (and tests _register_plugins()) again and again;
    each time every plugin command was added once more, and Typer rebuilds its whole command
    tree on every call: a test worker's `turnout decide` took 0.8 s instead of 15 ms."""
    from turnout.oracle.cli import _register_plugins, app

    _register_plugins()
    counts = (len(app.registered_commands), len(app.registered_groups))
    _register_plugins()
    _register_plugins()
    assert (len(app.registered_commands), len(app.registered_groups)) == counts
