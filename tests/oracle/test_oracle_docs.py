"""The oracle's docs stay in step with the code they describe."""

from __future__ import annotations

from pathlib import Path

from oracle.config import DEFAULTS, FIELDS
from oracle.fields import field_table
from oracle.sources.command_flags import DECISION_FLAGS, IGNORED_FLAGS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "oracle-api.md").read_text()


def test_every_ignored_flag_is_documented() -> None:
    missing = [f for f in IGNORED_FLAGS if f"`{f}`" not in DOC]
    assert not missing, missing


def test_every_decision_flag_is_documented() -> None:
    missing = [f.name for f in DECISION_FLAGS if f"`{f.name}`" not in DOC]
    assert not missing, missing


def test_field_table_is_generated_from_the_declarations() -> None:
    start = DOC.index("<!-- field table: generated")
    start = DOC.index("\n", start) + 1
    end = DOC.index("<!-- end of field table -->")
    want = field_table(FIELDS, DEFAULTS)
    assert DOC[start:end] == want, (
        "docs/oracle-api.md's field table is stale; replace it with:\n" + want)
    assert "| parallelism | `tensor_parallel_size` | int >= 1 | `1` |" in want
