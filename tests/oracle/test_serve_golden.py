"""Each vllm-<release> pack against vLLM's own ``create_engine_config`` on real ``vllm serve``
lines: the decision, the error text and every log line of the selection, in order.

policies/reference/vllm-<release>/serve_golden.jsonl holds seeded lines (referee/serve_gen.py)
with what the release's own code answered when each was parsed by its ``vllm serve`` parser
and built with ``EngineArgs.create_engine_config()`` over real config.json files (``make
referee``; referee/serve_real.py). Here each line is read the way ``turnout decide -- vllm
serve ...`` reads it (the oracle's own parser and the same config.json files, written from
policies/reference/model_configs) and decided by the release's pack. vLLM is not needed: the
files hold its answers.

A line the pack answers differently must be listed in :data:`KNOWN` with the class of the
disagreement, as docs/fidelity.md ("What is still wrong") names it; a listed line that agrees
again fails too, so the list never goes stale.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from referee.compare import agree, line_answer
from referee.serve_gen import resolve, write_models
from turnout.oracle import load_pack

REFERENCE = Path(__file__).resolve().parents[2] / "policies" / "reference"
RELEASES = sorted(
    p.parent.name.removeprefix("vllm-") for p in REFERENCE.glob("vllm-*/serve_golden.jsonl")
)

#: release -> {case id: the class of the disagreement (docs/fidelity.md)}; none is left
KNOWN: dict[str, dict[str, str]] = {}


def _lines(release: str) -> list[dict]:
    path = REFERENCE / f"vllm-{release}" / "serve_golden.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    write_models(folder)
    return folder


def test_every_release_has_a_serve_golden_file() -> None:
    assert RELEASES == ["0.29", "0.30", "0.31", "0.32", "0.33"]


@pytest.mark.parametrize("release", RELEASES)
def test_pack_agrees_with_create_engine_config_on_every_line(release: str, models: Path) -> None:
    cases = _lines(release)
    assert len(cases) >= 1000
    assert {c["want"]["decision"] for c in cases} == {"v1", "v2", "error"}
    pack = load_pack(f"vllm-{release}")
    wrong: dict[str, tuple[dict, dict]] = {}
    for case in cases:
        assert case["vllm_version"].startswith(release), case["id"]
        got = line_answer(pack, case, resolve(case["argv"], models), release)
        want = json.loads(json.dumps(case["want"]).replace("{models}", str(models)))
        if not agree(want, got)[1]:
            wrong[case["id"]] = (want, got)
    known = KNOWN.get(release, {})
    unexplained = {k: v for k, v in wrong.items() if k not in known}
    assert not unexplained, (
        f"{len(unexplained)} of {len(cases)} lines disagree with vLLM, first: "
        f"{list(unexplained.items())[:3]}"
    )
    assert not set(known) - set(wrong), f"listed in KNOWN but agree now: {set(known) - set(wrong)}"
