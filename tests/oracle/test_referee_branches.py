"""The referee's branch report (referee/branches.py): coverage.py's per-function figures turned
into docs/referee-coverage.md. coverage.py itself runs in the referee's venvs only, so this
checks the page built from reports of the shape ``branches.report`` writes, and that the
shipped page is the one the reports under .referee/ would give when they are there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from referee import branches
from referee.__main__ import main as referee_main

ROOT = Path(__file__).resolve().parents[2]


def _report(release: str, covered: int, untaken: list[dict]) -> dict:
    files = {
        rel: {"covered_branches": 0, "num_branches": None, "functions": {}}
        for rel in branches.FILES
    }
    files["config/vllm.py"] = {"covered_branches": covered, "num_branches": 10, "functions": {}}
    focus = {
        "config/vllm.py:VllmConfig.use_v2_model_runner": {
            "covered_branches": 10 - len(untaken),
            "num_branches": 10,
            "untaken": untaken,
        }
    }
    return {"release": release, "cases": 100, "files": files, "focus": focus}


def test_the_page_names_every_untaken_branch_per_release() -> None:
    untaken = [
        {"line": 662, "text": "if not HAS_TRITON:", "to": 663},
        {"line": 670, "text": "return False", "to": -1},
    ]
    page = branches.markdown([_report("0.32", 7, untaken), _report("0.33", 10, [])])
    assert "| `config/vllm.py` | 7/10 (70 %) | 10/10 (100 %) |" in page
    assert "| `config/cache.py` | not run | not run |" in page
    assert "- **0.32**: 8/10 (80 %) branches taken; not taken:" in page
    assert "  - line 662 → line 663: `if not HAS_TRITON:`" in page
    assert "  - line 670 → exit: `return False`" in page
    assert "- **0.33**: 10/10 (100 %) branches taken; not taken:\n  - none" in page


def test_a_function_a_release_lacks_is_said_so() -> None:
    older = _report("0.29", 5, [])
    older["focus"] = {}
    page = branches.markdown([older, _report("0.33", 5, [])])
    assert "- **0.29**: not in this release" in page


def test_the_coverage_doc_command_writes_the_page(tmp_path: Path) -> None:
    paths = []
    for release in ("0.31", "0.33"):
        path = tmp_path / f"coverage-{release}.json"
        path.write_text(json.dumps(_report(release, 4, [])), encoding="utf-8")
        paths.append(str(path))
    out = tmp_path / "page.md"
    assert referee_main(["coverage-doc", *paths, "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == branches.markdown(
        [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    )


@pytest.mark.parametrize("content", [None, "{not json", '{"release": "0.33"}'])
def test_a_missing_or_foreign_report_is_named_and_nothing_written(
    tmp_path: Path, content: str | None
) -> None:
    report = tmp_path / "coverage-0.33.json"
    if content is not None:
        report.write_text(content, encoding="utf-8")
    out = tmp_path / "page.md"
    with pytest.raises(SystemExit) as exc:
        referee_main(["coverage-doc", str(report), "--out", str(out)])
    assert str(exc.value).startswith(
        f"referee coverage-doc: {report}: not a serve-check --coverage report ("
    )
    assert not out.exists()


def test_the_shipped_page_matches_the_reports_when_they_are_here() -> None:
    reports = sorted((ROOT / ".referee").glob("coverage-*.json"))
    if len(reports) < 5:
        pytest.skip("make referee-coverage has not run in this checkout (.referee/coverage-*.json)")
    page = branches.markdown([json.loads(p.read_text(encoding="utf-8")) for p in reports])
    assert (ROOT / "docs" / "referee-coverage.md").read_text(encoding="utf-8") == page
