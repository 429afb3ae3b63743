"""The vllm-0.31 pack agrees with vLLM 0.31.0's own runner selection on every reference case:
the decision, the error message and every log line (policies/reference/vllm031_cases.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnout.oracle import decide, load_pack
from turnout.oracle.sources.spec import load_specs

CASES_FILE = Path(__file__).resolve().parents[2] / "policies" / "reference" / "vllm031_cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line.strip()]
ENTRIES = {e.id: e for e in load_specs(CASES_FILE)}


def test_every_case_is_read() -> None:
    assert len(CASES) == 51
    assert all(e.config is not None and e.error is None for e in ENTRIES.values())


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_vllm031_case(case: dict) -> None:
    pack = load_pack("vllm-0.31")
    entry = ENTRIES[case["id"]]
    assert entry.config is not None
    d = decide(entry.config, pack=pack)
    want = case["want"]
    assert (d.runner or "error") == want["decision"], d
    assert [m.to_json() for m in d.messages] == want["warnings"]
    if want["decision"] == "error":
        assert d.error == want["error"]
    else:
        assert d.error is None
