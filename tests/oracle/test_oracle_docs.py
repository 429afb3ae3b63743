"""The oracle's docs stay in step with the code they describe."""

from __future__ import annotations

from pathlib import Path

from oracle.sources.command_flags import DECISION_FLAGS, IGNORED_FLAGS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "oracle-api.md").read_text()


def test_every_ignored_flag_is_documented() -> None:
    missing = [f for f in IGNORED_FLAGS if f"`{f}`" not in DOC]
    assert not missing, missing


def test_every_decision_flag_is_documented() -> None:
    missing = [f.name for f in DECISION_FLAGS if f"`{f.name}`" not in DOC]
    assert not missing, missing
