"""The real-code referee's cases, read by turnout (python -m referee serve-check, docs/fidelity.md).

vLLM's side of the check needs the release wheels (``make referee-serve-check``); what runs here
is everything else: the seeded ``vllm serve`` lines are the same for the same seed, draw only
flags the release's parser has, name real model configs, and are read and decided by turnout's
own command reader for every release, so a mismatch the check reports is a decision, never a
line turnout could not read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from referee.compare import line_answer
from referee.serve_gen import FLAGS, generate, models, resolve, write_models
from referee.stand_in import _EXTENSION
from turnout.oracle import load_pack
from turnout.oracle.sources.command_table import load_table

RELEASES = ("0.29", "0.30", "0.31", "0.32", "0.33")


@pytest.mark.parametrize("release", RELEASES)
def test_lines_are_seeded_and_read_by_turnout_for_every_release(
    release: str, tmp_path: Path
) -> None:
    table = load_table(release).data
    cases = list(generate(table, 5, 150))
    assert cases == list(generate(table, 5, 150))
    assert cases != list(generate(table, 6, 150))  # another seed, other lines
    folder = tmp_path / "models"
    written = write_models(folder)
    assert set(written) == set(models())
    options = {o for a in table["actions"] for o in a["option_strings"]}
    pack = load_pack(f"vllm-{release}")
    decisions: Counter[str] = Counter()
    for case in cases:
        argv = resolve(case["argv"], folder)
        assert "{models}" not in " ".join(argv)
        assert Path(argv[2], "config.json").is_file()
        flags = [w for w in argv[3:] if w.startswith("-")]
        assert set(flags) <= options, set(flags) - options
        got = line_answer(pack, case, argv, release)
        assert got["decision"] != "invalid", (case, got)
        decisions[got["decision"]] += 1
    # Both runners and refusals come up: the lines reach the selection's branches.
    assert decisions["v1"] >= 10 and decisions["v2"] >= 30 and decisions["error"] >= 5, decisions


def test_models_are_real_configs_of_several_kinds() -> None:
    architectures = {c["architectures"][0] for c in models().values()}
    # a dense decoder, MoE, MLA, a hybrid, attention-free, an embedding and a cross-encoder model
    for arch in (
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "DeepseekV2ForCausalLM",
        "JambaForCausalLM",
        "MambaForCausalLM",
        "BertModel",
        "BertForSequenceClassification",
    ):
        assert arch in architectures, arch


def test_a_flag_missing_from_a_release_is_never_drawn() -> None:
    table = load_table("0.33").data
    kept = {"actions": [a for a in table["actions"] if "--enable-dbo" not in a["option_strings"]]}
    lines = [c["argv"] for c in generate({**table, **kept}, 9, 300)]
    assert not any("--enable-dbo" in argv for argv in lines)
    assert any("--enable-dbo" in c["argv"] for c in generate(table, 9, 300))
    assert "--enable-dbo" in FLAGS


@pytest.mark.parametrize(
    ("name", "stubbed"),
    [
        ("vllm._C", True),
        ("vllm._C_stable_libtorch", True),
        ("vllm._moe_C", True),
        ("vllm.vllm_flash_attn._vllm_fa3_C", True),
        ("vllm._qutlass_C", True),
        ("vllm.config", False),
        ("vllm._custom_ops", False),
        ("vllm.platforms.cuda", False),
        ("vllm.model_executor.layers.activation", False),
        ("torch._C", False),
    ],
)
def test_only_compiled_extensions_are_stood_in_for(name: str, stubbed: bool) -> None:
    assert bool(_EXTENSION.match(name)) is stubbed
