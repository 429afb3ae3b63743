"""Bad policy packs are refused with file:line:column and what was expected."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from turnout.oracle import PackError, load_pack
from turnout.oracle.errors import ErrorCode
from turnout.oracle.pack import POLICIES_DIR


@pytest.fixture
def pack_dir(tmp_path: Path) -> Path:
    dest = tmp_path / "pack"
    shutil.copytree(POLICIES_DIR / "turnout", dest)
    return dest


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def _issues(folder: Path) -> list[str]:
    with pytest.raises(PackError) as info:
        load_pack(folder)
    return [str(i) for i in info.value.issues]


def test_unknown_key_names_file_line_column_and_expected_keys(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(
        cm,
        "    severity: soft\n    when: {enable_dbo: true}",
        "    severity: soft\n    colour: red\n    when: {enable_dbo: true}",
    )
    (issue,) = _issues(pack_dir)
    line = _line_of(cm, "colour: red")
    assert issue.startswith(f"{cm}:{line}:5: error: unknown key 'colour'")
    assert "expected one of: id, label, blocks" in issue


def test_unknown_dimension_value(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(cm, "when: {speculative_method: suffix}", "when: {speculative_method: sufix}")
    (issue,) = _issues(pack_dir)
    line = _line_of(cm, "speculative_method: sufix")
    assert f"{cm}:{line}:" in issue and "unknown value 'sufix' for speculative_method" in issue
    assert "expected one of: none, eagle3" in issue


def test_bad_type(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(cm, "when: {cpu_offload_gb: {gt: 0}}", "when: {cpu_offload_gb: {gt: lots}}")
    (issue,) = _issues(pack_dir)
    assert f"{cm}:{_line_of(cm, 'gt: lots')}:" in issue and "gt expects a number" in issue


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("enabled: true", 'enabled: "yes"', "enabled: Input should be a valid boolean"),
        ("percentage: 100", 'percentage: "100"', "percentage: Input should be a valid integer"),
        ("enabled: true", "enabled: 1", "enabled: Input should be a valid boolean"),
    ],
)
def test_types_are_not_coerced(pack_dir: Path, old: str, new: str, expected: str) -> None:
    # A quoted "yes" or a 1 where the schema wants a boolean is a mistake to report, not to
    # read as true.
    ro = pack_dir / "rollout.yaml"
    _edit(ro, old, new)
    (issue,) = _issues(pack_dir)
    assert issue.startswith(f"{ro}:{_line_of(ro, new)}:") and expected in issue


def test_bad_severity_literal(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(
        cm,
        "    severity: soft\n    when: {enable_dbo: true}",
        "    severity: medium\n    when: {enable_dbo: true}",
    )
    (issue,) = _issues(pack_dir)
    assert f"{cm}:{_line_of(cm, 'severity: medium')}:15:" in issue
    assert "'hard' or 'soft'" in issue


def test_duplicate_rule_id(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(cm, "  - id: suffix_speculation", "  - id: ngram_speculation")
    (issue,) = _issues(pack_dir)
    assert "duplicate rule id 'ngram_speculation'" in issue
    lines = [
        i
        for i, text in enumerate(cm.read_text().splitlines(), 1)
        if text == "  - id: ngram_speculation"
    ]
    assert issue.startswith(f"{cm}:{lines[1]}:9:")


def test_unknown_family_in_stage(pack_dir: Path) -> None:
    ro = pack_dir / "rollout.yaml"
    _edit(ro, "families: [granite_moe]", "families: [granit_moe]")
    (issue,) = _issues(pack_dir)
    assert f"{ro}:{_line_of(ro, 'granit_moe')}:" in issue and "unknown family 'granit_moe'" in issue


def test_duplicate_yaml_key(pack_dir: Path) -> None:
    fam = pack_dir / "families.yaml"
    _edit(fam, "  qwen3:\n", "  qwen3:\n    label: X\n")
    (issue,) = _issues(pack_dir)
    assert "duplicate key 'label'" in issue and str(fam) in issue


def test_unknown_placeholder_in_label(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(cm, "label: mamba cache mode 'all'", "label: mamba cache mode '{mamba_mode}'")
    (issue,) = _issues(pack_dir)
    assert "unknown placeholder {mamba_mode}" in issue


def test_yaml_syntax_error(pack_dir: Path) -> None:
    ro = pack_dir / "rollout.yaml"
    ro.write_text("stages:\n  - id: [unclosed\n")
    (issue,) = _issues(pack_dir)
    assert issue.startswith(f"{ro}:") and "YAML syntax" in issue


def test_all_problems_are_reported_at_once(pack_dir: Path) -> None:
    cm = pack_dir / "capability_matrix.yaml"
    _edit(cm, "when: {speculative_method: medusa}", "when: {speculative_method: medusaa}")
    _edit(cm, "when: {enable_elastic_ep: true}", "when: {enable_elastic_epp: true}")
    issues = _issues(pack_dir)
    assert len(issues) == 2
    assert (
        "unknown dimension 'enable_elastic_epp'" in issues[1]
        or "unknown dimension 'enable_elastic_epp'" in issues[0]
    )


def test_missing_pack() -> None:
    from turnout.oracle import OracleError

    with pytest.raises(OracleError) as info:
        load_pack("no-such-pack")
    assert info.value.code == ErrorCode.UNKNOWN_PACK
