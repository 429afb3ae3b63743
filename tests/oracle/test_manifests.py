"""The turnout pack's ``pack.manifests`` key: the runners' capability manifests, read as data
(policies/turnout/manifests.json), and the oracle's refusal of an architecture no runner of
this build serves (error code ``architecture_not_served``), from Python and the command line.
The service's /api/v1/decide answers it too (tests/dashboard/test_api.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from turnout.oracle import DeploymentConfig, PackError, decide, load_pack
from turnout.oracle.lint import lint_pack
from turnout.oracle.pack import POLICIES_DIR

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "policies" / "reference" / "model_configs"
#: The list the refusal names: every architecture of the manifests, by runner kind (the model
#: layer grows on other branches: read it, do not type it).
SERVED = load_pack("turnout").served_architectures or {}
SUPPORTED = "supported: " + "; ".join(
    f"{', '.join(sorted(SERVED[k]))} ({k})" for k in sorted(SERVED)
)


def turnout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "turnout"
    shutil.copytree(POLICIES_DIR / "turnout", folder)
    return folder


def test_the_pack_reads_the_manifests() -> None:
    pack = load_pack("turnout")
    assert set(pack.manifests or {}) == {"v1", "v2"}
    assert pack.manifests["v1"].speculative_methods == ["ngram"]
    assert pack.manifests["v2"].features["logits_processors"] is False
    served = pack.served_architectures or {}
    assert set(served) == {"generate", "pooling"}
    assert served["generate"] >= {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    }
    assert served["pooling"] == {
        "BertModel",
        "BertForSequenceClassification",
        "LlamaForSequenceClassification",
    }
    assert "Qwen3ForCausalLM" in SUPPORTED and SUPPORTED.endswith(
        " (generate); BertForSequenceClassification, BertModel, LlamaForSequenceClassification (pooling)"
    )
    assert "LlamaForSequenceClassification" not in served["generate"]  # a reward model pools
    assert load_pack("vllm-0.31").manifests is None  # vLLM's runners load far more


def test_an_architecture_no_runner_serves_is_refused_before_any_rule() -> None:
    pack = load_pack("turnout")
    d = decide(
        DeploymentConfig(architecture="Mamba2ForCausalLM", speculative_method="ngram"), pack=pack
    )
    assert (d.runner, d.mode, d.reason_code, d.family, d.stage) == (
        None,
        "auto",
        "ERROR",
        "mamba",
        None,
    )
    assert d.error_code == "architecture_not_served"
    assert (
        d.error == f"no runner of this build serves architecture 'Mamba2ForCausalLM'; {SUPPORTED}"
    )
    assert [r.rule_id for r in d.reasons] == ["error.architecture_not_served"]  # not ngram's
    assert d.reasons[0].reference == "turnout/manifests.json" and d.messages == ()
    # The same model under vLLM 0.31's pack is decided (its runners load it).
    assert decide(
        DeploymentConfig(architecture="Mamba2ForCausalLM"), pack=load_pack("vllm-0.31")
    ).runner


def test_an_invalid_runner_variable_is_named_first() -> None:
    d = decide(
        DeploymentConfig(
            architecture="Mamba2ForCausalLM", env={"TURNOUT_USE_V2_MODEL_RUNNER": "yes"}
        ),
        pack=load_pack("turnout"),
    )
    assert d.error_code == "invalid_env"


def test_cli_architecture_and_config_forms(tmp_path: Path) -> None:
    r = turnout("decide", "--architecture", "Mamba2ForCausalLM")
    assert r.returncode == 3, r.stdout + r.stderr
    assert (
        "error (architecture_not_served): no runner of this build serves architecture "
        "'Mamba2ForCausalLM'" in " ".join(r.stdout.split())
    )
    assert "Using V2 Model Runner" not in r.stdout
    # A Mamba-2 config.json (state-spaces/mamba2 keys; no runner loads Mamba-2 yet).
    mamba2 = tmp_path / "config.json"
    mamba2.write_text(
        json.dumps(
            {
                "architectures": ["Mamba2ForCausalLM"],
                "model_type": "mamba2",
                "hidden_size": 768,
                "num_hidden_layers": 24,
                "state_size": 128,
                "vocab_size": 50288,
            }
        )
    )
    for path, arch in ((mamba2, "Mamba2ForCausalLM"),):
        r = turnout("decide", "--config", str(path), "--json")
        assert r.returncode == 3, r.stderr
        out = json.loads(r.stdout)
        assert out["runner"] is None and out["error_code"] == "architecture_not_served"
        assert out["error"] == f"no runner of this build serves architecture {arch!r}; {SUPPORTED}"
    for name in ("qwen3-0.6b.json", "mamba-130m.json"):
        r = turnout("decide", "--config", str(CONFIGS / name), "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["runner"] in ("v1", "v2"), (
            name,
            r.stdout,
        )


def test_explain_offers_nothing_for_it() -> None:
    r = turnout("explain", "--architecture", "Mamba2ForCausalLM", "--json")
    out = json.loads(r.stdout)
    assert out["suggestions"] == [] and "no runner of this build serves" in out["note"]


def test_the_manifests_are_part_of_the_pack_digest(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path = folder / "manifests.json"
    data = json.loads(path.read_text())
    data["runners"]["v1"]["architectures"]["generate"].append("Mamba2ForCausalLM")
    path.write_text(json.dumps(data))
    pack = load_pack(folder)
    assert pack.digest != load_pack("turnout").digest
    d = decide(DeploymentConfig(architecture="Mamba2ForCausalLM"), pack=pack)
    assert d.error_code is None and d.runner == "v1"


def test_a_broken_manifests_file_is_a_pack_error_at_its_line(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path = folder / "manifests.json"
    text = path.read_text().replace('"requires_triton": false', '"requires_triton": "no"', 1)
    path.write_text(text)
    with pytest.raises(PackError) as err:
        load_pack(folder)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if '"requires_triton": "no"' in t)
    assert f"manifests.json:{line}:" in str(err.value) and "requires_triton" in str(err.value)
    path.unlink()
    with pytest.raises(PackError, match=r"manifests.json:1:1: error: cannot read"):
        load_pack(folder)


def test_lint_names_a_served_architecture_the_pack_does_not_know(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path = folder / "manifests.json"
    data = json.loads(path.read_text())
    data["runners"]["v2"]["architectures"]["generate"].append("BrandNewForCausalLM")
    data["runners"]["v2"]["architectures"]["pooling"].append("LlamaForCausalLM")
    path.write_text(json.dumps(data, indent=2))
    issues = lint_pack(folder)
    messages = [f"{i.severity}: {i.message}" for i in issues]
    assert (
        "error: architecture 'BrandNewForCausalLM' is served by runner v2 but not in "
        "families.yaml: its deployments get unknown_architecture"
    ) in messages
    (issue,) = [i for i in issues if "BrandNew" in i.message]
    assert issue.file.endswith("manifests.json") and issue.line > 1  # at the list entry
    assert not any("'LlamaForCausalLM'" in m for m in messages)  # served for generate as well
    assert lint_pack("turnout") == []
