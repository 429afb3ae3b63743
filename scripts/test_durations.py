"""Write tests/durations.json from a JUnit report: each test file's seconds, summed over its tests.

``make test`` hands the files to its workers longest first (tests/conftest.py), so that no long
file starts last and leaves the other workers idle at the end. Refresh after a file grows a lot:

    make test-durations      # the whole suite once, then this script over its report

Usage: python scripts/test_durations.py REPORT.xml [OUT.json]
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def file_of(classname: str) -> str | None:
    """``tests.dashboard.test_api.TestX`` → ``tests/dashboard/test_api.py`` (the longest prefix
    that names a file of the tree), or None."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (ROOT / candidate).is_file():
            return candidate
    return None


def durations(report: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of each test), longest first."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        name = file_of(case.get("classname", ""))
        if name is not None:
            seconds[name] += float(case.get("time") or 0.0)
    return {name: round(value, 1) for name, value in seconds.most_common()}


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[2]) if len(argv) == 3 else ROOT / "tests" / "durations.json"
    table = durations(Path(argv[1]))
    if not table:
        print(f"{argv[1]}: no test case names a file of this tree", file=sys.stderr)
        return 1
    out.write_text(json.dumps(table, indent=0) + "\n")
    print(f"{out}: {len(table)} files, {sum(table.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
