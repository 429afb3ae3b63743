"""The Python blocks of README.md run as shown, from a directory other than the checkout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.splitlines()[0] for b in BLOCKS])
def test_readme_python_block_runs(block: str, tmp_path: Path) -> None:
    # The load_model block named a bare file name, which exists in no directory a reader is in.
    out = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
