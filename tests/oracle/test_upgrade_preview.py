"""Upgrade previews: the matrix cells and the fleet lines whose runner changes from one release
pack to another, with the reasons of both sides (oracle.matrix_diff, oracle.compare,
``turnout matrix --diff A B``, ``turnout decide --commands F --pack A --compare B``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from turnout.oracle import DeploymentConfig, load_pack
from turnout.oracle.cli import app
from turnout.oracle.compare import by_family, sides
from turnout.oracle.matrix import scenarios
from turnout.oracle.matrix_diff import MatrixDiff, _classes, _pairs, diff_packs, unknown_fields


@pytest.fixture(scope="module")
def diff_031_032() -> MatrixDiff:
    return diff_packs(load_pack("vllm-0.31"), load_pack("vllm-0.32"))


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_deciding_one_architecture_per_class_finds_every_changed_cell(
    diff_031_032: MatrixDiff,
) -> None:
    before, after = diff_031_032.before, diff_031_032.after
    classes = _classes((before, after), sorted(before.architectures))
    shared = [members for members in classes.values() if len(members) > 1][:3]
    # DeepSeek-V4 is named by 0.31's ROCm V1 default and has AFMoE's attributes: a class of
    # its own, or its platform=rocm cell would be missed.
    archs = sorted(
        {a for members in shared for a in members[:4]}
        | {"AfmoeForCausalLM", "DeepseekV4ForCausalLM", "LLaDAModelLM"}
    )
    every = [
        (c.architecture, c.pin, c.scenario, c.change)
        for c in _pairs(before, after, None, list(diff_031_032.scenarios), archs)
    ]
    found = [
        (c.architecture, c.pin, c.scenario, c.change)
        for c in diff_031_032.changes
        if c.architecture in archs
    ]
    assert every and sorted(every) == sorted(found)
    assert ("DeepseekV4ForCausalLM", "auto", "platform=rocm", "v1→v2") in found
    assert not any(c[0] == "AfmoeForCausalLM" and c[2] == "platform=rocm" for c in found)
    assert diff_031_032.num_cells == len(before.architectures) * 3 * len(diff_031_032.scenarios)


@pytest.mark.parametrize(
    ("a", "b"), [("vllm-0.31", "vllm-0.32"), ("turnout", "vllm-0.31"), ("vllm-0.29", "vllm-0.33")]
)
def test_architectures_of_one_class_change_alike(a: str, b: str) -> None:
    before, after = load_pack(a), load_pack(b)
    cols = scenarios(before)
    classes = _classes((before, after), sorted(before.architectures))
    shared = [members[:3] for members in classes.values() if len(members) > 1][:4]
    archs = [x for members in shared for x in members]
    seen: dict[str, set[tuple[str, str, str]]] = {x: set() for x in archs}
    for c in _pairs(before, after, None, cols, archs):
        seen[c.architecture].add((c.pin, c.scenario, c.change))
    assert any(seen.values())
    for members in shared:
        assert all(seen[x] == seen[members[0]] for x in members), members


def test_fields_a_release_lacks_are_named_and_their_scenarios_left_out(
    diff_031_032: MatrixDiff,
) -> None:
    assert (diff_031_032.unknown_before, diff_031_032.unknown_after) == (
        (),
        ("enable_sequence_parallelism",),
    )
    assert {s.id for s in diff_031_032.left_out} == {
        "enable_sequence_parallelism=true",
        "rule:sequence_parallelism_with_tp",
    }
    assert not any(
        r.rule_id == "error.unknown_setting" for c in diff_031_032.changes for r in c.after.reasons
    )
    assert unknown_fields(load_pack("vllm-0.32"), load_pack("vllm-0.33")) == (
        ("draft_lm_head_quantization",),
        (),
    )
    assert unknown_fields(load_pack("vllm-0.29"), load_pack("vllm-0.30")) == (
        ("hisparse", "watermark"),
        (),
    )


def test_a_changed_cell_carries_the_reasons_of_both_sides(diff_031_032: MatrixDiff) -> None:
    cells = {(c.architecture, c.pin, c.scenario): c for c in diff_031_032.changes}
    ngram = cells[("Qwen3ForCausalLM", "auto", "speculative_method=ngram")]
    assert ngram.change == "v1→v2"
    assert [r.rule_id for r in ngram.before.reasons] == ["unsupported_speculative_method"]
    assert ngram.after.reasons == () and ngram.after.reason_code == "DEFAULT"
    mamba = cells[("Qwen3ForCausalLM", "auto", "mamba_cache_mode=all")]
    assert mamba.change == "v1→refuse"
    assert [r.rule_id for r in mamba.after.reasons] == ["step.mamba_cache_mode_all_refused"]
    assert "Input should be 'align' or 'none'" in (mamba.after.error or "")
    assert ("Qwen3ForCausalLM", "auto", "default") not in cells


def test_sides_name_a_normalisation_only_one_release_makes() -> None:
    # vLLM 0.29 turns compilation off for GLM-5 on ROCm (breakable CUDA graphs); 0.30 keeps
    # that for DeepSeek-V4.1 alone, and its ROCm V1 default then picks V1.
    config = DeploymentConfig(architecture="GlmMoeDsaForCausalLM", platform="rocm")
    before, after = sides(load_pack("vllm-0.29"), load_pack("vllm-0.30"), config)
    assert (before.outcome, after.outcome) == ("v2", "v1")
    assert before.only_steps == ("breakable_cudagraph_disables_compile",)
    assert before.why() == ["DEFAULT", "step:breakable_cudagraph_disables_compile"]
    assert after.why() == ["rocm_default_v1"]


def test_matrix_diff_of_two_named_packs_as_json(diff_031_032: MatrixDiff) -> None:
    code, out = _invoke("matrix", "--diff", "vllm-0.31", "vllm-0.32", "--json")
    assert code == 1, out  # cells change runner: exit 1, as diff
    body = json.loads(out)
    assert (body["from"], body["to"]) == ("vllm-0.31", "vllm-0.32")
    assert body["changed_cells"] == len(diff_031_032.changes) == sum(body["changes"].values())
    assert body["unknown_fields"] == {"vllm-0.31": [], "vllm-0.32": ["enable_sequence_parallelism"]}
    assert body["left_out"][0]["fields"] == {"enable_sequence_parallelism": ["vllm-0.32"]}
    group = next(
        g
        for g in body["groups"]
        if g["scenario"] == "speculative_method=ngram" and g["pin"] == "auto"
    )
    assert group["change"] == "v1→v2" and group["why_from"] == {
        "unsupported_speculative_method": group["cells"]
    }
    assert sum(sum(c.values()) for c in body["by_family"].values()) == body["changed_cells"]


def test_matrix_diff_table_says_which_fields_a_release_lacks() -> None:
    code, out = _invoke("matrix", "--pack", "vllm-0.29", "--diff", "vllm-0.30")
    assert code == 1, out
    assert "cells change runner from vllm-0.29 to vllm-0.30" in out
    assert "why (vllm-0.29)" in out and "kv_sharing_fast_prefill" in out
    assert "fields vllm-0.29 does not know (and vllm-0.30 does): hisparse, watermark" in out
    assert "hisparse=true (hisparse: not in vllm-0.29)" in out


def test_matrix_diff_exits_1_when_cells_change_and_0_when_none_do() -> None:
    """As ``diff`` and ``decide --compare``: a CI step fails on a pack change that moves a cell
    (README.md and docs/oracle-api.md say so)."""
    assert _invoke("matrix", "--diff", "vllm-0.31", "vllm-0.32")[0] == 1
    assert _invoke("matrix", "--diff", "vllm-0.31", "vllm-0.32", "--json")[0] == 1
    assert _invoke("matrix", "--diff", "vllm-0.32", "vllm-0.32")[0] == 0
    assert _invoke("matrix", "--pack", "vllm-0.32", "--diff", "vllm-0.32", "--json")[0] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["matrix", "--pack", "turnout", "--diff", "vllm-0.31", "vllm-0.32"],
        ["matrix", "--diff", "vllm-0.31", "vllm-0.32", "vllm-0.33"],
        ["matrix", "vllm-0.31"],
    ],
)
def test_matrix_pack_pairs_that_name_no_clear_pair_exit_2(args: list[str]) -> None:
    code, out = _invoke(*args)
    assert code == 2 and "bad_usage" in out


def test_matrix_diff_with_an_unknown_pack_exits_2() -> None:
    code, out = _invoke("matrix", "--diff", "vllm-0.31", "vllm-0.99")
    assert code == 2 and "no policy pack 'vllm-0.99'" in out


FLEET = """# the fleet, one line per deployment
vllm serve Qwen/Qwen3-8B --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'
VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-8B \\
    --compilation-config '{"mode": "STOCK_TORCH_COMPILE"}'
vllm serve Qwen/Qwen3-8B -tp 2 --compilation-config '{"pass_config": {"enable_sp": true}}'
vllm serve Qwen/Qwen3-8B --mamba-cache-mode all
vllm serve Qwen/Qwen3-8B -tp 2
vllm serve '<checkpoint>'
vllm serve Qwen/Qwen3-8B --speculative-config '{"method": "ngram"
{"id": "json-line", "env": {}, "argv": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]}
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.txt"
    path.write_text(FLEET)
    return path


def test_compare_reports_each_line_that_changes_and_why(fleet: Path) -> None:
    code, out = _invoke(
        "decide",
        "--commands",
        str(fleet),
        "--pack",
        "vllm-0.31",
        "--compare",
        "vllm-0.32",
        "--json",
    )
    assert code == 1, out
    body = json.loads(out)
    assert (
        body["num_deployments"],
        body["num_changed"],
        body["num_unchanged"],
        body["num_bad_input"],
    ) == (8, 4, 2, 2)
    assert body["changes"] == {"v1→v2": 1, "refuse→v2": 1, "v1→refuse": 2}
    by_id = {d["id"]: d for d in body["deployments"]}
    assert by_id["fleet.txt:2"]["change"] == "v1→v2"
    assert by_id["fleet.txt:2"]["before"]["why"] == ["unsupported_speculative_method"]
    assert by_id["fleet.txt:3"]["change"] == "refuse→v2"  # the continued line, pinned to V2
    assert by_id["fleet.txt:3"]["before"]["error_code"] == "pin_conflict"
    # Each release's own parser reads the line: 0.32's CompilationConfig has no enable_sp and
    # its --mamba-cache-mode no longer offers 'all', so those deployments would not start.
    assert by_id["fleet.txt:5"]["after"]["error_code"] == "bad_flag_value"
    assert "pass_config.enable_sp" in by_id["fleet.txt:5"]["after"]["error"]
    assert by_id["fleet.txt:6"]["after"]["why"] == ["error.bad_flag_value"]
    assert "vLLM 0.32.0" in by_id["fleet.txt:6"]["after"]["error"]
    assert by_id["json-line"]["change"] is None
    assert by_id["fleet.txt:8"]["error_code"] == "placeholder_model"
    assert "not a shell command line" in by_id["fleet.txt:9"]["error"]
    qwen3 = next(f for f in body["by_family"] if f["family"] == "qwen3")
    assert (qwen3["deployments"], qwen3["changed"]) == (5, 4)


def test_compare_markdown_and_no_change_exit_0(fleet: Path) -> None:
    code, out = _invoke(
        "decide",
        "--commands",
        str(fleet),
        "--pack",
        "vllm-0.31",
        "--compare",
        "vllm-0.32",
        "--markdown",
    )
    assert code == 1
    assert (
        "| fleet.txt:6 | Qwen/Qwen3-8B | qwen3 | v1→refuse | mamba_cache_mode_all | "
        "error.bad_flag_value |" in out
    )
    assert (
        "**lines that could not be read**" in out and "| fleet.txt:8 | placeholder_model |" in out
    )
    code, out = _invoke(
        "decide",
        "--commands",
        str(fleet),
        "--pack",
        "vllm-0.32",
        "--compare",
        "vllm-0.32",
        "--summary",
    )
    assert code == 0 and "0 change runner" in out and "fleet.txt:8" not in out


def test_compare_with_an_unknown_pack_exits_2_with_the_reason(fleet: Path) -> None:
    code, out = _invoke(
        "decide", "--commands", str(fleet), "--pack", "vllm-0.31", "--compare", "vllm-0.3", "--json"
    )
    assert code == 2
    body = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert body["error_code"] == "unknown_pack" and "vllm-0.3" in body["error"]


def test_text_lines_of_a_commands_file_decide_with_their_environment(fleet: Path) -> None:
    code, out = _invoke("decide", "--commands", str(fleet), "--pack", "vllm-0.31", "--json")
    assert code == 2  # two lines cannot be read
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == [f"fleet.txt:{n}" for n in (2, 3, 5, 6, 7, 8, 9)] + [
        "json-line"
    ]
    assert rows[1]["mode"] == "pinned" and rows[1]["error_code"] == "pin_conflict"
    assert rows[4]["runner"] == "v2"


def test_by_family_puts_unreadable_lines_last_with_their_codes() -> None:
    from turnout.oracle.compare import DeploymentChange

    before, after = load_pack("vllm-0.31"), load_pack("vllm-0.32")
    ok = DeploymentChange(
        "a",
        "m",
        *sides(
            before,
            after,
            DeploymentConfig(architecture="Qwen3ForCausalLM", speculative_method="ngram"),
        ),
    )
    bad = DeploymentChange("b", None, None, None, "no model", "placeholder_model")
    summaries = by_family([bad, ok])
    assert [s.family for s in summaries] == ["qwen3", "(bad input)"]
    assert summaries[0].changes == {"v1→v2": 1}
    assert summaries[0].why_before == [("unsupported_speculative_method", 1)]
    assert summaries[1].why_before == [("placeholder_model", 1)]


def test_a_line_only_the_newer_release_reads_is_a_refusal_before(tmp_path: Path) -> None:
    # 0.33 added --disable-chunked-prefill; 0.32's parser refuses it: refuse→v2, and the
    # before side says why in that parser's words.
    fleet = tmp_path / "fleet.txt"
    fleet.write_text("vllm serve Qwen/Qwen3-8B --disable-chunked-prefill\n")
    code, out = _invoke(
        "decide",
        "--commands",
        str(fleet),
        "--pack",
        "vllm-0.32",
        "--compare",
        "vllm-0.33",
        "--json",
    )
    (row,) = json.loads(out)["deployments"]
    assert code == 1 and row["change"] == "refuse→v2", out
    assert row["before"]["error_code"] == "unknown_flag"
    assert "--disable-chunked-prefill" in row["before"]["error"]


def test_a_line_nested_too_deeply_is_reported_alone(tmp_path: Path) -> None:
    # Each was a RecursionError traceback that ended the whole run.
    deep = "[" * 3000 + "]" * 3000
    fleet = tmp_path / "fleet.txt"
    fleet.write_text(
        f"vllm serve Qwen/Qwen3-8B --speculative-config '{deep}'\n"
        f'{{"id": "deep-json", "argv": {deep}}}\n'
        "vllm serve Qwen/Qwen3-8B\n"
    )
    code, out = _invoke("decide", "--commands", str(fleet), "--pack", "vllm-0.31", "--json")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["error_code"] for r in rows] == ["bad_flag_value", "bad_spec", None], out
    assert all("nested too deeply" in r["error"] for r in rows[:2]) and rows[2]["runner"] == "v2"
    assert code == 2  # bad input on some lines
