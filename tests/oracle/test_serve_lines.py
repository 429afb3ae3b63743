"""The real-code referee's cases, read by turnout (python -m referee serve-check, docs/fidelity.md).

vLLM's side of the check needs the release wheels (``make referee-serve-check``); what runs here
is everything else: the seeded ``vllm serve`` lines are the same for the same seed, draw only
flags the release's parser has, name real model configs, and are read and decided by turnout's
own command reader for every release, so a mismatch the check reports is a decision, never a
line turnout could not read.
"""

from __future__ import annotations

import json
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
    assert decisions["v1"] >= 5 and decisions["v2"] >= 30 and decisions["error"] >= 5, decisions


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


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    ("model", "flags", "want"),
    [
        # Qwen3-8B: 32 attention heads, 8 KV heads (its config.json)
        (
            "qwen3-8b",
            ["-tp", "3"],
            "Total number of attention heads (32) must be divisible by tensor parallel size (3).",
        ),
        (
            "qwen3-8b",
            ["-tp", "8", "--decode-context-parallel-size", "2"],
            "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (8) to be "
            "greater than the model's total number of KV heads (8). Increase "
            "`--tensor-parallel-size` or set `--decode-context-parallel-size 1`.",
        ),
        ("qwen3-8b", ["-tp", "2", "-dcp", "4"], "tp_size=2 must be divisible by dcp_size=4."),
        # DCP is at most TP // KV heads (16 // 8 = 2)
        (
            "qwen3-8b",
            ["-tp", "16", "-dcp", "4"],
            "`--decode-context-parallel-size` (4) exceeds the maximum supported value (2) for "
            "`--tensor-parallel-size` (16) and 8 model KV heads.",
        ),
        ("qwen3-8b", ["-tp", "16", "-dcp", "2"], None),
        # An attention-free model has 0 KV heads: vLLM divides by them and fails
        ("mamba-130m", ["-dcp", "2", "-pcp", "2"], "integer division or modulo by zero"),
        # An n-gram draft is the target itself, verified with the target's layout before the
        # target is: its head count against TP comes before expert parallelism
        (
            "all-minilm-l6-v2",
            [
                "-tp",
                "8",
                "--enable-expert-parallel",
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 2}',
            ],
            "Total number of attention heads (12) must be divisible by tensor parallel size (8).",
        ),
        # With PCP, DCP must be 1, PCP or TP x PCP; the text lists sorted({1, pcp, tp * pcp})
        (
            "qwen3-8b",
            ["-tp", "2", "-pcp", "2", "-dcp", "8"],
            "When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x "
            "PCP axis. Got TP=2, PCP=2, DCP=8; valid DCP sizes are [1, 2, 4].",
        ),
        # DeepSeek-V2-Lite uses MLA: the GQA check does not apply; TP 2 divides its 16 heads
        ("deepseek-v2-lite", ["-tp", "2", "--decode-context-parallel-size", "2"], None),
        # Mamba has no attention heads (vLLM reads 0, which every TP divides)
        ("mamba-130m", ["-tp", "3"], None),
        # BertModel does not implement SupportsPP; Qwen3 does
        (
            "all-minilm-l6-v2",
            ["-pp", "2"],
            "Pipeline parallelism is not supported for this model. Supported models implement "
            "the `SupportsPP` interface.",
        ),
        ("qwen3-8b", ["-pp", "2"], None),
        # vLLM looks the connector up (and refuses one it does not register) with full CUDA
        # graphs before the selection, and again after it for the hybrid KV cache manager; the
        # refusal names it (it once rendered as None)
        (
            "qwen3-8b",
            ["--kv-transfer-config", '{"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"}'],
            "Unsupported connector type: P2pNcclConnector",
        ),
        (
            "qwen3-8b",
            [
                "--enforce-eager",
                "--kv-transfer-config",
                '{"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"}',
            ],
            "Unsupported connector type: P2pNcclConnector",
        ),
        # MTP drafts from the target itself: Qwen3's model type has no MTP variant
        (
            "qwen3-8b",
            ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
            "Unsupported speculative method: 'mtp'",
        ),
        # ...but an embedding model's MTP draft (the model itself, runner "draft") is refused
        # first, before its model type is looked at
        (
            "all-minilm-l6-v2",
            ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
            "Embedding models do not support `--runner draft`. Use `--runner pooling` or "
            "`--runner auto` for embedding models.",
        ),
        # A draft model of another vocabulary (Llama 3.1's 128,256 against Qwen3's 151,936),
        # read from the draft's own config.json; the same vocabulary starts
        (
            "llama-3.1-8b",
            ["--speculative-config", '{"method": "draft_model", "model": "{models}/qwen3-0.6b"}'],
            "Target and draft model should have the same vocabulary size. Target model "
            "vocab_size=128256. Draft model vocab_size=151936. Using models with different "
            "tokenizers can cause out-of-bounds errors during speculative decoding.",
        ),
        (
            "qwen3-8b",
            ["--speculative-config", '{"method": "draft_model", "model": "{models}/qwen3-0.6b"}'],
            None,
        ),
    ],
)
def test_refusals_that_read_the_models_facts(
    release: str, model: str, flags: list[str], want: str | None, tmp_path: Path
) -> None:
    """Steps whose facts come from config.json or the model class (head counts, model type,
    SupportsPP; the spec golden files reach only the last: test_release_golden.FACT_STEPS);
    vLLM's own create_engine_config gave these texts."""
    folder = write_models(tmp_path)[model]
    argv = ["vllm", "serve", str(folder), *(f.replace("{models}", str(tmp_path)) for f in flags)]
    case = {"env": {}, "platform": "cuda", "device_capability": "9.0"}
    got = line_answer(load_pack(f"vllm-{release}"), case, argv, release)
    if want is None:
        assert got["decision"] in ("v1", "v2"), got
    else:
        assert (got["decision"], got.get("error")) == ("error", want), got


def test_a_draft_model_is_read_for_its_vocabulary_and_a_missing_one_is_listed_as_ignored(
    tmp_path: Path,
) -> None:
    from turnout.oracle.sources import command_to_fields

    folders = write_models(tmp_path)
    spec = '{"method": "draft_model", "model": "%s"}'
    found = command_to_fields(
        ["vllm", "serve", str(folders["llama-3.1-8b"]), "--speculative-config",
         spec % folders["qwen3-0.6b"]],
        {}, release="0.33", offline=True,
    )  # fmt: skip
    assert found.fields["vocab_size"] == 128256 and found.fields["draft_vocab_size"] == 151936
    assert "--speculative-config.model" not in found.ignored
    missing = command_to_fields(
        ["vllm", "serve", str(folders["llama-3.1-8b"]), "--speculative-config",
         spec % (tmp_path / "no-such-draft")],
        {}, release="0.33", offline=True,
    )  # fmt: skip
    assert "draft_vocab_size" not in missing.fields
    assert "--speculative-config.model" in missing.ignored  # said, never dropped silently


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    ("draft", "method", "refused_as"),
    [
        # EAGLEConfig names an EAGLE draft "Eagle" + its architecture; no release registers
        # EagleQwen3ForCausalLM, every release registers Eagle3Qwen3ForCausalLM and
        # EagleLlamaForCausalLM (the releases' own registries, referee/registry.py)
        ("qwen3-0.6b", "eagle", "EagleQwen3ForCausalLM"),
        ("qwen3-0.6b", "eagle3", None),
        ("llama-3.1-8b", "eagle", None),
        ("qwen3-0.6b", "dflash", "DFlashQwen3ForCausalLM"),
    ],
)
def test_an_eagle_draft_is_renamed_and_looked_up_in_the_releases_registry(
    release: str, draft: str, method: str, refused_as: str | None, tmp_path: Path
) -> None:
    """The draft's architecture comes from its config.json; vLLM's refusal quotes the whole
    registry of the release (its text, from the release's ModelRegistry)."""
    folders = write_models(tmp_path)
    target = "llama-3.1-8b" if draft == "llama-3.1-8b" else "qwen3-8b"
    spec = json.dumps({"method": method, "model": str(folders[draft])})
    argv = ["vllm", "serve", str(folders[target]), "--speculative-config", spec]
    case = {"env": {}, "platform": "cuda", "device_capability": "9.0"}
    got = line_answer(load_pack(f"vllm-{release}"), case, argv, release)
    if refused_as is None:
        assert got["decision"] in ("v1", "v2"), got
        return
    error = got.get("error") or ""
    assert got["decision"] == "error", got
    assert error.startswith(
        f"Model architectures ['{refused_as}'] are not supported for now. Supported "
        "architectures: dict_keys(['AfmoeForCausalLM', "
    ), error[:200]
    assert error.endswith("'TransformersMultiModalForSequenceClassification'])"), error[-200:]
    assert "'Eagle3Qwen3ForCausalLM'" in error and "'EagleQwen3ForCausalLM'," not in error


@pytest.mark.parametrize("release", RELEASES)
def test_lora_on_a_model_class_without_supports_lora(release: str, tmp_path: Path) -> None:
    """0.33's LoRAConfig.verify_with_model_config refuses a model class without SupportsLoRA,
    naming the model as the command gave it; earlier releases start."""
    folder = write_models(tmp_path)["mamba-130m"]
    argv = ["vllm", "serve", str(folder), "--enable-lora"]
    case = {"env": {}, "platform": "cuda", "device_capability": "9.0"}
    got = line_answer(load_pack(f"vllm-{release}"), case, argv, release)
    if release != "0.33":
        assert got["decision"] in ("v1", "v2"), got
        return
    assert got == {
        "decision": "error",
        "error": f"LoRA is not supported for MambaForCausalLM ({folder}). Supported models "
        "implement the `SupportsLoRA` interface. Run this model without `enable_lora`.",
        "warnings": [],
    }
