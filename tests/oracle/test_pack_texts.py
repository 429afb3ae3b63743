"""A pack's ``texts`` (named constants a refusal quotes as ``{texts.NAME}``) and ``open``
string dimensions (representative values; a condition may name others):
docs/policy-language.md, "Texts" and "Dimensions"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from turnout.oracle import DeploymentConfig, PackError, load_pack
from turnout.oracle.pack import POLICIES_DIR

_STEP = """
steps:
  - id: unlisted_draft
    before: draft_architecture_unregistered
    when: {speculative_method: draft_model, draft_architecture: NotADraftForCausalLM}
    refuse: "{draft_architecture} is not one of {texts.drafts}"
"""


def _pack(tmp_path: Path, body: str) -> Path:
    """A pack extending the shipped vllm-0.29 with ``body`` as its matrix."""
    folder = tmp_path / "mine"
    folder.mkdir(parents=True)
    families = POLICIES_DIR / "turnout" / "families.yaml"
    (folder / "families.yaml").write_text(f"families_from: {families}\n", encoding="utf-8")
    shutil.copy(POLICIES_DIR / "vllm-0.29" / "rollout.yaml", folder / "rollout.yaml")
    head = "pack:\n  name: mine\n  release: '0.29'\n  extends: vllm-0.29\n"
    (folder / "capability_matrix.yaml").write_text(head + body, encoding="utf-8")
    return folder


def _issues(folder: Path) -> list[str]:
    with pytest.raises(PackError) as info:
        load_pack(folder)
    return [str(i) for i in info.value.issues]


def test_a_refusal_quotes_a_text_verbatim_braces_and_all(tmp_path: Path) -> None:
    folder = _pack(tmp_path, "texts:\n  drafts: \"{'A', 'B'} and {x}\"\n" + _STEP)
    config = DeploymentConfig(
        architecture="Qwen3ForCausalLM",
        speculative_method="draft_model",
        draft_architecture="NotADraftForCausalLM",
    )
    decision = load_pack(folder).decide(config)
    assert decision.runner is None
    assert decision.error == "NotADraftForCausalLM is not one of {'A', 'B'} and {x}"


def test_an_extending_pack_replaces_a_text_by_name(tmp_path: Path) -> None:
    """The shipped 0.30 pack quotes its own registry, not 0.29's (each release writes it:
    python -m referee draft-registry)."""
    config = DeploymentConfig(
        architecture="Qwen3ForCausalLM",
        speculative_method="eagle",
        draft_architecture="Qwen3ForCausalLM",
    )
    old = load_pack("vllm-0.29").decide(config).error or ""
    new = load_pack("vllm-0.33").decide(config).error or ""
    assert old.startswith("Model architectures ['EagleQwen3ForCausalLM'] are not supported")
    assert new.startswith("Model architectures ['EagleQwen3ForCausalLM'] are not supported")
    assert "'ParseAuxMTPModel'" in new and "'ParseAuxMTPModel'" not in old


def test_an_unknown_text_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    folder = _pack(tmp_path, "texts:\n  draft: x\n" + _STEP)
    (issue,) = _issues(folder)
    assert f"{folder / 'capability_matrix.yaml'}:" in issue
    assert "unknown text {texts.drafts}; the pack's texts: draft" in issue


def test_a_closed_string_domain_refuses_other_values_and_an_open_one_takes_them(
    tmp_path: Path,
) -> None:
    closed = _pack(
        tmp_path,
        "dimensions:\n  draft_architecture: {domain: [LlamaForCausalLM]}\n"
        "texts:\n  drafts: x\n" + _STEP,
    )
    issues = _issues(closed)
    assert any("unknown value 'NotADraftForCausalLM' for draft_architecture" in i for i in issues)
    opened = _pack(
        tmp_path / "again",
        "dimensions:\n  draft_architecture: {open: true, domain: [LlamaForCausalLM]}\n"
        "texts:\n  drafts: x\n" + _STEP,
    )
    assert load_pack(opened).name == "mine"


def test_only_a_string_dimension_is_open(tmp_path: Path) -> None:
    folder = _pack(tmp_path, "dimensions:\n  tensor_parallel_size: {open: true, domain: [1, 2]}\n")
    (issue,) = _issues(folder)
    assert "open: only a string dimension is open; 'tensor_parallel_size' is int" in issue
