"""lint_pack(): static analysis of rules and stages, at file:line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from turnout.oracle.lint import lint_pack
from turnout.oracle.pack import POLICIES_DIR


@pytest.fixture
def pack_dir(tmp_path: Path) -> Path:
    dest = tmp_path / "pack"
    shutil.copytree(POLICIES_DIR / "turnout", dest)
    return dest


def _add_rule(folder: Path, text: str) -> None:
    cm = folder / "capability_matrix.yaml"
    cm.write_text(cm.read_text() + text)


def _messages(folder: Path) -> list[str]:
    return [f"{i.severity}: {i.message}" for i in lint_pack(folder)]


def test_shipped_packs_are_clean() -> None:
    assert lint_pack("turnout") == []
    assert lint_pack("vllm-0.31") == []


def test_rule_that_can_never_match(pack_dir: Path) -> None:
    _add_rule(
        pack_dir,
        "  - id: huge_tp\n    label: huge TP\n    blocks: v2\n"
        "    when: {tensor_parallel_size: {gt: 64}}\n",
    )
    (msg,) = _messages(pack_dir)
    assert msg == (
        "error: rule 'huge_tp' can never match: no value of tensor_parallel_size "
        "satisfies its condition"
    )


def test_rule_contradicting_a_derived_dimension_can_never_match(pack_dir: Path) -> None:
    _add_rule(
        pack_dir,
        "  - id: quantized_unquantized\n    label: x\n    blocks: v2\n"
        "    when: {quantized: true, quantization: none}\n"
        "  - id: pooling_generate\n    label: y\n    blocks: v2\n"
        "    when: {pooling: true, runner_kind: generate}\n",
    )
    cm = pack_dir / "capability_matrix.yaml"
    cm.write_text(cm.read_text().replace("  is_moe: {}\n", "  is_moe: {}\n  runner_kind: {}\n"))
    assert _messages(pack_dir) == [
        "error: rule 'quantized_unquantized' can never match: no value of quantized, "
        "quantization satisfies its condition",
        "error: rule 'pooling_generate' can never match: no value of pooling, runner_kind "
        "satisfies its condition",
    ]


def test_derived_and_source_spellings_of_one_rule_are_duplicates(pack_dir: Path) -> None:
    _add_rule(
        pack_dir,
        "  - id: unquantized_suffix\n    label: x\n    blocks: v2\n"
        "    when: {quantized: false, speculative_method: medusa}\n"
        "  - id: none_suffix\n    label: y\n    blocks: v2\n"
        "    when: {quantization: none, speculative_method: medusa}\n",
    )
    msgs = _messages(pack_dir)
    assert (
        "error: rule 'none_suffix' duplicates 'unquantized_suffix': both match the same "
        "deployments with the same effect"
    ) in msgs


def test_rule_for_a_family_with_no_such_architecture(pack_dir: Path) -> None:
    _add_rule(
        pack_dir,
        "  - id: qwen3_llama\n    label: x\n    blocks: v2\n"
        "    when: {family: qwen3, architecture: LlamaForCausalLM}\n",
    )
    cm = (pack_dir / "capability_matrix.yaml").read_text()
    text = cm.replace("  triton_available: {}\n", "  triton_available: {}\n  architecture: {}\n")
    (pack_dir / "capability_matrix.yaml").write_text(text)
    issues = lint_pack(pack_dir)
    assert len(issues) == 1 and "no architecture meets" in issues[0].message
    assert issues[0].line == len(text.splitlines()) - 3


def test_duplicate_and_shadowed_rules(pack_dir: Path) -> None:
    _add_rule(
        pack_dir,
        "  - id: ngram_again\n    label: n-gram\n    blocks: v2\n"
        "    when: {speculative_method: ngram}\n"
        "  - id: only_fp8_ngram\n    label: n-gram with FP8\n    blocks: v2\n"
        "    when: {speculative_method: ngram, quantization: fp8}\n",
    )
    msgs = _messages(pack_dir)
    assert (
        "error: rule 'ngram_again' duplicates 'ngram_speculation': both match the same "
        "deployments with the same effect"
    ) in msgs
    assert any(m.startswith("warning: rule 'only_fp8_ngram' is shadowed by") for m in msgs)


def test_unreachable_stage_and_ambiguous_family(pack_dir: Path) -> None:
    ro = pack_dir / "rollout.yaml"
    ro.write_text(
        ro.read_text().replace(
            "  - id: all-families\n",
            "  - id: qwen3-again\n    label: Qwen3 again\n    families: [qwen3]\n"
            "    when: {quantized: false, pooling: false}\n  - id: all-families\n",
        )
    )
    msgs = _messages(pack_dir)
    assert any(m.startswith("error: stage 'qwen3-again' can never be reached") for m in msgs)
    assert any(
        "family 'qwen3' is listed by stages 'qwen3-canary' and 'qwen3-again'" in m for m in msgs
    )


def test_family_in_no_stage(pack_dir: Path) -> None:
    ro = pack_dir / "rollout.yaml"
    text = ro.read_text()
    ro.write_text(text[: text.index("  - id: all-families")])
    msgs = _messages(pack_dir)
    assert (
        "warning: family 'jamba' has deployments in no stage (quantized=False); they get "
        "V1, the default runner"
    ) in msgs


def test_schema_errors_are_lint_errors(pack_dir: Path) -> None:
    _add_rule(pack_dir, "  - id: BadId\n    label: x\n    blocks: v2\n    when: {lora: true}\n")
    (issue,) = lint_pack(pack_dir)
    assert issue.severity == "error" and "id" in issue.message
