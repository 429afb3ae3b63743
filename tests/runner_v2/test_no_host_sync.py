"""runner_v2's step path never waits for the device (docs/architecture.md §5.4): no ``.item()``,
``.tolist()``, ``.cpu()``, ``.synchronize()`` or ``torch.cuda.synchronize`` in runner_v2 or in
the launchers of the kernels it uses, except where a step's results are collected
(``AsyncOutput.get_output`` and its helpers). Torch references (``*_ref``) are test oracles,
not step code. The GPU suite checks the same at run time with CUDA's sync debug mode."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BANNED_METHODS = {"item", "tolist", "cpu", "synchronize"}
#: Functions allowed to wait: the collection of a step's results.
COLLECTION = {
    ("runner_v2/async_output.py", "get_output"),
    ("runner_v2/async_output.py", "_concat"),
    ("runner_v2/async_output.py", "_logprobs"),
    ("runner_v2/async_output.py", "_speculative_tokens"),
    # start-up, before the KV cache is sized: never on the step path
    ("runner_v2/memory_profile.py", "profile_peak_bytes"),
}
KERNELS = [
    "staged_writes",
    "query_start_loc",
    "positions",
    "input_ids",
    "slot_mapping",
    "logits_indices",
    "penalties",
    "gumbel_sample",
    "topk_logprobs",
    "post_update",
    "_select",
    "_checks",
    "_padding",
    "gumbel_noise",
    "fused_moe",
    "moe_align",
    "mla_attention",
    "mla_cache",
    "causal_conv1d",
    "selective_scan",
    "rejection_sample",
    "sampling_probs",
    "ngram_propose",
    "spec_post_update",
    "paged_attention",
    "paged_attention_split",
    "_paged_tiles",
    "rotary",
    "rms_norm",
    "silu_mul",
]
FILES = (
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "runner_v2").glob("*.py"))
    + [f"kernels/{name}.py" for name in KERNELS]
    + ["engine/runner_setup.py"]
)  # the set-up and the pooling step runner_v2 shares with runner_v1


def _violations(path: str) -> list[str]:
    tree = ast.parse((ROOT / path).read_text())
    found: list[str] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.endswith("_ref") or (path, node.name) in COLLECTION:
                return  # a torch reference, or the collection of results
            func = node.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            dotted = ast.unparse(node.func)
            if name in BANNED_METHODS or dotted == "torch.cuda.synchronize":
                found.append(f"{path}:{node.lineno} in {func}: {dotted}()")
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "<module>")
    return found


@pytest.mark.parametrize("path", FILES)
def test_no_host_sync_on_the_step_path(path: str) -> None:
    assert _violations(path) == []


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    # The collection itself does synchronise: the check must see it once the allowance goes.
    allowed = set(COLLECTION)
    COLLECTION.clear()
    try:
        found = _violations("runner_v2/async_output.py")
    finally:
        COLLECTION.update(allowed)
    assert any("synchronize" in v for v in found) and any("tolist" in v for v in found)
