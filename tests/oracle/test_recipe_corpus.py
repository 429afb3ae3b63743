"""Every real `vllm serve` line of policies/reference/vllm_recipes.jsonl decides or fails with a
clear, specific error (never an exception, never a generic message)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from turnout.oracle import ConfigError, decide, from_command, load_pack
from turnout.oracle.errors import ErrorCode

RECIPES_FILE = Path(__file__).resolve().parents[2] / "policies" / "reference" / "vllm_recipes.jsonl"
RECIPES = [json.loads(line) for line in RECIPES_FILE.read_text().splitlines() if line.strip()]
# Error codes that are specific and say what to pass (docs/oracle-api.md, "Errors").
SPECIFIC = {
    ErrorCode.PLACEHOLDER_MODEL,
    ErrorCode.PLACEHOLDER_VALUE,
    ErrorCode.UNKNOWN_MODEL,
    ErrorCode.BAD_COMMAND,
    ErrorCode.UNKNOWN_FLAG,
    ErrorCode.BAD_FLAG_VALUE,
    ErrorCode.BAD_VALUE,
}


@pytest.mark.parametrize("pack_name", ["turnout", "vllm-0.31"])
def test_every_recipe_decides_or_fails_clearly(pack_name: str) -> None:
    pack = load_pack(pack_name)
    outcomes: Counter[str] = Counter()
    for rec in RECIPES:
        try:
            cfg = from_command(rec["argv"], rec["env"])
        except ConfigError as exc:
            assert exc.code in SPECIFIC, (rec["id"], exc.code, exc.message)
            assert len(exc.message) > 20, (rec["id"], exc.message)
            outcomes[exc.code] += 1
            continue
        d = decide(cfg, pack=pack)
        assert d.error_code != ErrorCode.UNKNOWN_ARCHITECTURE, (rec["id"], d.error)
        outcomes[d.runner or "no runner"] += 1
    assert sum(outcomes.values()) == len(RECIPES)
    decided = outcomes["v1"] + outcomes["v2"] + outcomes["no runner"]
    assert decided >= 2 * len(RECIPES) // 3, outcomes  # known_models.yaml covers most lines


def test_placeholders_are_named() -> None:
    by_id = {r["id"]: r for r in RECIPES}
    with pytest.raises(ConfigError, match="placeholder") as info:
        from_command(by_id["recipe-0006"]["argv"], {})
    assert "architecture=ARCH" in info.value.message  # Python's words: not --architecture
    with pytest.raises(ConfigError, match="a word of prose") as info:
        from_command(by_id["recipe-0004"]["argv"], {})
    assert info.value.code == ErrorCode.PLACEHOLDER_MODEL
    with pytest.raises(ConfigError, match=r"\$TP"):
        from_command(by_id["recipe-0241"]["argv"], {})


def test_known_models_are_sourced_and_known_to_both_packs() -> None:
    from turnout.oracle.sources.known_models import load_known_models

    models = load_known_models()
    assert len(models) >= 100
    for pack_name in ("turnout", "vllm-0.31"):
        archs = load_pack(pack_name).architectures
        for model_id, entry in models.items():
            assert entry.architecture in archs, (pack_name, model_id)
    assert all(len(e.source) > 20 for e in models.values())


def test_docs_table_is_current() -> None:
    """docs/oracle-recipes.md holds the output of the command it names, for both packs."""
    import subprocess
    import sys

    doc = (RECIPES_FILE.parents[2] / "docs" / "oracle-recipes.md").read_text()
    for pack_name in ("turnout", "vllm-0.31"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "turnout.oracle.cli",
                "decide",
                "--pack",
                pack_name,
                "--commands",
                "policies/reference/vllm_recipes.jsonl",
                "--summary",
                "--markdown",
            ],
            capture_output=True,
            text=True,
            cwd=RECIPES_FILE.parents[2],
        )
        assert out.stdout.strip() in doc, f"regenerate the {pack_name} table in the doc"
