"""Every recipe line is read as each vLLM release's own `vllm serve` parser reads it.

policies/reference/vllm-<release>/recipes_parse.jsonl holds the release's verdict on every line
of policies/reference/vllm_recipes.jsonl (`python -m referee flags-recipes`, run on the
release's wheel). No vLLM here: the oracle's parser must give the same verdict on every line,
no line the release accepts may be refused for a flag, and no line it refuses may be decided.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from turnout.oracle import ConfigError, from_command
from turnout.oracle.errors import ErrorCode
from turnout.oracle.sources.command import check_line
from turnout.oracle.sources.command_table import REFERENCE_DIR, available_releases

RECIPES = {
    r["id"]: r
    for r in map(json.loads, (REFERENCE_DIR / "vllm_recipes.jsonl").read_text().splitlines())
}
FOR_A_FLAG = {ErrorCode.UNKNOWN_FLAG, ErrorCode.BAD_FLAG_VALUE}


def _verdicts(release: str) -> list[dict[str, object]]:
    path = REFERENCE_DIR / f"vllm-{release}" / "recipes_parse.jsonl"
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("release", available_releases())
def test_recipes_parse_as_the_release_parses_them(release: str) -> None:
    verdicts = _verdicts(release)
    assert {v["id"] for v in verdicts} == set(RECIPES)
    counts: Counter[str] = Counter()
    for v in verdicts:
        rec = RECIPES[str(v["id"])]
        _, error = check_line(rec["argv"], release=release)
        assert (error is None) == v["accepted"], (v, error and error.message)
        try:
            from_command(rec["argv"], rec["env"], release=release)
            decided = True
        except ConfigError as exc:
            decided = False
            assert not (v["accepted"] and exc.code in FOR_A_FLAG), (v["id"], exc.message)
        assert v["accepted"] or not decided, v["id"]
        counts["accepted" if v["accepted"] else "refused"] += 1
        counts["decided"] += decided
    print(f"vLLM {release}: {dict(counts)}")  # pytest -s shows the counts
    assert counts["accepted"] + counts["refused"] == len(RECIPES)


def test_the_counts_of_vllm_031() -> None:
    """The figures docs/oracle-recipes.md reports."""
    verdicts = _verdicts("0.31")
    accepted = sum(bool(v["accepted"]) for v in verdicts)
    assert (accepted, len(verdicts) - accepted) == (280, 51)
    stages = Counter(str(v["stage"]) for v in verdicts if not v["accepted"])
    assert stages == {"parser": 27, "cli": 24}, stages  # cli: --omni (vllm-omni)
