"""The oracle's docs stay in step with the code they describe."""

from __future__ import annotations

from pathlib import Path

from turnout.oracle.config import DEFAULTS, FIELDS
from turnout.oracle.fields import field_table
from turnout.oracle.sources.command_fields import DERIVED, DIRECT, MODEL_SOURCE
from turnout.oracle.sources.command_table import load_table

DOC = (Path(__file__).resolve().parents[2] / "docs" / "oracle-api.md").read_text()


def test_every_flag_that_feeds_the_decision_is_documented() -> None:
    table = load_table()
    flags = [
        next(o for o in table.action(d)["option_strings"] if o.startswith("--"))
        for d in (*DIRECT, *DERIVED, *MODEL_SOURCE)
        if d != "model_tag"
    ]
    missing = [f for f in flags if f"`{f}`" not in DOC]
    assert not missing, missing


def test_field_table_is_generated_from_the_declarations() -> None:
    start = DOC.index("<!-- field table: generated")
    start = DOC.index("\n", start) + 1
    end = DOC.index("<!-- end of field table -->")
    want = field_table(FIELDS, DEFAULTS)
    assert DOC[start:end] == want, (
        "docs/oracle-api.md's field table is stale; replace it with:\n" + want
    )
    assert "| parallelism | `tensor_parallel_size` | int >= 1 | `1` |" in want
