"""Data-driven decision cases: tests/oracle/cases/*.yaml (note, input, want / want_error with its
``code`` and what its message ``contains`` and ``lacks``; ``pack``
to decide with another pack, ``manifests: false`` to decide with the turnout pack's rules and
stages but without its runners' manifests)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from turnout.oracle import (
    CanarySnapshot,
    ConfigError,
    Decision,
    DeploymentConfig,
    ErrorCode,
    decide,
    from_command,
    from_spec,
    load_pack,
)
from turnout.oracle.pack import POLICIES_DIR, Pack
from turnout.oracle.sources import release_for_pack

CASES_DIR = Path(__file__).parent / "cases"


def _load() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        for case in yaml.safe_load(path.read_text()):
            out.append((f"{path.stem}: {case['note']}", case))
    return out


CASES = _load()


def _config(inp: dict[str, Any], pack: Pack) -> DeploymentConfig:
    """A case's config; a command line is read by the pack's release's vllm serve parser."""
    if "command" in inp:
        return from_command(
            inp["command"],
            inp.get("env") or {},
            architecture=inp.get("architecture"),
            release=release_for_pack(pack),
        )
    return from_spec(inp)


def _check(d: Decision, want: dict[str, Any]) -> None:
    got = d.to_json()
    for key in ("runner", "mode", "reason_code", "stage", "family", "error", "error_code"):
        if key in want:
            assert got[key] == want[key], f"{key}: {got[key]!r} != {want[key]!r}\n{got}"
    if want.get("error_code") is not None:  # the case names a real code, produced as one
        assert d.error_code is ErrorCode(want["error_code"]), d.error_code
    if "rules" in want:
        assert [r["rule_id"] for r in got["reasons"]] == want["rules"], got
    if "messages" in want:
        assert got["messages"] == want["messages"], got
    if "canary" in want:
        assert got["canary"] == want["canary"], got
    for rule_id, matched in want.get("matched", {}).items():
        reason = next(r for r in got["reasons"] if r["rule_id"] == rule_id)
        assert reason["matched"] == matched, reason


@pytest.fixture(scope="session")
def turnout_without_manifests(tmp_path_factory: pytest.TempPathFactory) -> Pack:
    """The turnout pack's rules and stages without its runners' manifests (``manifests:
    false`` cases: how the rollout classifies model kinds no runner of this build loads yet)."""
    folder = tmp_path_factory.mktemp("packs") / "turnout"
    shutil.copytree(POLICIES_DIR / "turnout", folder)
    matrix = folder / "capability_matrix.yaml"
    text = matrix.read_text()
    assert "\n  manifests: manifests.json\n" in text
    matrix.write_text(text.replace("\n  manifests: manifests.json\n", "\n"))
    pack = load_pack(folder)
    assert pack.served_architectures is None
    return pack


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[n for n, _ in CASES])
def test_case(case: dict[str, Any], request: pytest.FixtureRequest) -> None:
    if case.get("manifests", True):
        pack = load_pack(case.get("pack", "turnout"))
    else:
        pack = request.getfixturevalue("turnout_without_manifests")
    canaries = CanarySnapshot.from_json(case["canaries"]) if "canaries" in case else None
    if "want_error" in case:
        with pytest.raises(ConfigError) as info:
            _config(case["input"], pack)
        assert info.value.code is ErrorCode(case["want_error"]["code"]), info.value
        assert case["want_error"].get("contains", "") in info.value.message
        if "lacks" in case["want_error"]:
            assert case["want_error"]["lacks"] not in info.value.message
        return
    d = decide(_config(case["input"], pack), pack=pack, canaries=canaries)
    _check(d, case["want"])
    assert decide(_config(case["input"], pack), pack=pack, canaries=canaries) == d


@pytest.mark.parametrize("pack_name", ["turnout", "vllm-0.31"])
def test_every_rule_has_a_case(pack_name: str) -> None:
    """Each rule of each shipped pack decides at least one data-driven or reference case."""
    if pack_name.startswith("vllm-"):
        pytest.skip(
            "a release pack's rules are each held to its golden file (test_release_golden.py)"
        )
    seen = {
        rule
        for _, case in CASES
        if case.get("pack", "turnout") == pack_name
        for rule in case.get("want", {}).get("rules", [])
    }
    missing = {r.id for r in load_pack(pack_name).rules} - seen
    assert not missing, missing
