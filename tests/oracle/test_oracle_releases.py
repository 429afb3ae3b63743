"""docs/oracle-releases.md is generated from the release packs and fails here when it drifts;
its per-release changes come from the ``extends`` merge."""

from __future__ import annotations

from turnout.oracle.releases import DOC, item_changes, merged, render_releases
from turnout.oracle.schema import Rule


def test_the_releases_doc_is_generated_from_the_packs() -> None:
    want = render_releases()
    assert DOC.read_text() == want, (
        "docs/oracle-releases.md is stale: run `python -m turnout.oracle.releases --write`"
    )
    assert "## vLLM 0.32 (`vllm-0.32`, extends `vllm-0.31`)" in want
    assert "`turnout matrix --diff vllm-0.31 vllm-0.32`" in want


def test_release_changes_come_from_the_extends_merge() -> None:
    a, b = merged("vllm-0.31"), merged("vllm-0.32")
    rules = item_changes({r.item.id: r.item for r in a.rules}, {r.item.id: r.item for r in b.rules})
    assert {"rocm_default_v1", "stock_torch_compile", "elastic_expert_parallel"} <= set(
        rules.removed
    )
    assert "heterogeneous_vocab" in rules.added
    assert ("unsupported_speculative_method", ["when"]) in rules.changed
    steps = item_changes({s.item.id: s.item for s in a.steps}, {s.item.id: s.item for s in b.steps})
    assert "mamba_cache_mode_all_refused" in steps.added
    assert "sp_needs_tensor_parallel" in steps.removed


def test_a_change_of_prose_or_placement_alone_is_no_change() -> None:
    old = Rule(id="r", label="x", blocks="v2", when={"enforce_eager": True}, reference="a:1")
    new = Rule(
        id="r",
        label="x",
        blocks="v2",
        when={"enforce_eager": True},
        reference="a:2",
        reason="why",
        after="other",
    )
    assert item_changes({"r": old}, {"r": new}).changed == []
    moved = Rule(id="r", label="y", blocks="v2", when={"enforce_eager": True})
    assert item_changes({"r": old}, {"r": moved}).changed == [("r", ["label"])]
