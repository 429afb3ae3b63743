"""scripts/test_durations.py and the order make test hands files out (tests/conftest.py):
seconds per file from a JUnit report, and the committed table's files run longest first."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "test_durations.py"
spec = importlib.util.spec_from_file_location("test_durations_script", SCRIPT)
assert spec is not None and spec.loader is not None
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_wheel" name="test_a" time="30.5"/>
<testcase classname="tests.test_wheel" name="test_b" time="1.0"/>
<testcase classname="tests.dashboard.test_api" name="test_c" time="2.25"/>
<testcase classname="tests.dashboard.test_api.TestGroup" name="test_d" time="0.5"/>
<testcase classname="tests.gone.test_removed" name="test_e" time="9.0"/>
</testsuite></testsuites>
"""


def test_seconds_are_summed_per_file_and_unknown_files_left_out(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(REPORT)
    assert script.durations(report) == {
        "tests/test_wheel.py": 31.5,
        "tests/dashboard/test_api.py": 2.8,
    }
    out = tmp_path / "durations.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(report), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(out.read_text())) == [
        "tests/test_wheel.py",
        "tests/dashboard/test_api.py",
    ]


def test_a_report_that_names_no_file_of_the_tree_writes_nothing(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuite><testcase classname="elsewhere.test_x" name="t" time="1"/></testsuite>'
    )
    out = tmp_path / "durations.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(report), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "no test case names a file" in proc.stderr
    assert not out.exists()


def test_the_collected_suite_starts_with_its_longest_file() -> None:
    table = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert all(isinstance(v, float | int) and v >= 0 for v in table.values())
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/scripts", "tests/test_wheel.py", "tests/test_locks.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = [line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line]
    order = list(dict.fromkeys(files))
    expected = sorted(order, key=lambda f: -table.get(f, 5.0))
    assert order == expected and order[0] == "tests/test_wheel.py", order
