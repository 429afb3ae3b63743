"""The runners' capability manifests (engine/capabilities.py) and the generated file the turnout
pack reads (policies/turnout/manifests.json).

- the file is what the runners declare now (regenerate: ``python -m turnout.engine.capabilities --write``);
- each manifest comes from the code that implements or refuses things: the model layer's
  architecture tuples, runner_v1/spec_decode.py, runner_v2/refusals.py;
- an architecture added to the model layer reaches the oracle by regenerating the file alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from turnout import runner_v1, runner_v2
from turnout.engine import capabilities
from turnout.engine.capabilities import FEATURES, ManifestError, RunnerManifest, live_manifests
from turnout.engine.config import DEVICE_TYPES, SUPPORTED_SPECULATIVE_METHODS
from turnout.engine.model import config as model_config
from turnout.runner_v1.spec_decode import SPECULATIVE_METHODS
from turnout.runner_v2 import refusals

ROOT = Path(__file__).resolve().parents[2]


def test_the_file_is_the_runners_manifests() -> None:
    assert capabilities.check_file() is None
    on_disk = json.loads(capabilities.MANIFESTS_FILE.read_text())
    assert on_disk["runners"] == {name: m.to_json() for name, m in live_manifests().items()}
    assert on_disk["generated_by"] == "python -m turnout.engine.capabilities --write"


def test_the_check_command_names_the_fix(tmp_path: Path) -> None:
    stale = tmp_path / "manifests.json"
    stale.write_text(capabilities.render(live_manifests()).replace('"ngram"', '"eagle"'))
    problem = capabilities.check_file(stale)
    assert problem is not None and "run `python -m turnout.engine.capabilities --write`" in problem
    assert "does not exist" in (capabilities.check_file(tmp_path / "missing.json") or "")
    out = subprocess.run(
        [sys.executable, "-m", "turnout.engine.capabilities", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "is current" in out.stdout


def test_each_manifest_is_derived_from_its_runners_code() -> None:
    layer = {
        "generate": tuple(
            a
            for a in model_config.SUPPORTED_ARCHITECTURES
            if a not in model_config.POOLING_ARCHITECTURES
        ),
        "pooling": tuple(model_config.POOLING_ARCHITECTURES),
    }
    assert set(layer["pooling"]) == {
        "BertModel",
        "BertForSequenceClassification",
        "LlamaForSequenceClassification",
    }
    v1, v2 = runner_v1.MANIFEST, runner_v2.MANIFEST
    for m in (v1, v2):
        assert {k: set(v) for k, v in m.architectures} == {k: set(v) for k, v in layer.items()}
        assert m.platforms == tuple(sorted(DEVICE_TYPES))
        assert m.pooling_tasks == ("classify", "embed", "reward", "score")
    assert v1.speculative_methods == SPECULATIVE_METHODS == ("ngram",)
    assert v1.refused == () and v1.honoured == tuple(sorted(FEATURES))
    assert (
        not v1.requires_triton and not v1.async_scheduling and v1.cuda_graphs
    )  # decode graphs, as MRV1
    assert set(v2.refused) == set(refusals.REFUSED_FEATURES) == {"cpu_offload", "logits_processors"}
    # runner_v2 serves what the engine expresses and refusals.py does not refuse (CPU ngram).
    assert v2.speculative_methods == ("draft_model", "ngram_gpu")
    assert set(v2.speculative_methods) == set(SUPPORTED_SPECULATIVE_METHODS) - set(
        refusals.REFUSED_SPECULATIVE_METHODS
    )
    assert v2.requires_triton and v2.async_scheduling and v2.cuda_graphs
    # Every method the engine can express is implemented by some runner.
    assert set(SUPPORTED_SPECULATIVE_METHODS) == set(v1.speculative_methods) | set(
        v2.speculative_methods
    )


def test_a_manifest_names_every_feature_once() -> None:
    with pytest.raises(ManifestError, match="unknown features"):
        RunnerManifest.build("v9", architectures={}, refused=["teleportation"])
    with pytest.raises(ManifestError, match=r"both honoured and refused \['cpu_offload'\]"):
        RunnerManifest("v9", (), (), ("cpu_offload",), tuple(FEATURES), (), (), False, False, False)
    with pytest.raises(ManifestError, match=r"neither \['prefix_caching'\]"):
        RunnerManifest(
            "v9",
            (),
            (),
            (),
            tuple(f for f in FEATURES if f != "prefix_caching"),
            (),
            (),
            False,
            False,
            False,
        )
    with pytest.raises(KeyError, match="unknown feature 'lora'"):
        runner_v1.MANIFEST.honours("lora")
    assert runner_v1.MANIFEST.honours("cpu_offload") and not runner_v2.MANIFEST.honours(
        "cpu_offload"
    )


def test_an_architecture_added_to_the_model_layer_reaches_the_oracle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What a branch adding an architecture to the model layer does: extend the config tuple,
    # regenerate the file. The manifest picks it up and the pack (a copy, with the regenerated
    # file) stops refusing it, with nothing else edited. The architecture: one families.yaml
    # lists that no runner serves yet (Mamba, while it is not in the model layer).
    from turnout.oracle import DeploymentConfig, decide
    from turnout.oracle.compile import compile_pack
    from turnout.oracle.pack import Pack

    pack_dir = tmp_path / "turnout"
    shutil.copytree(ROOT / "policies" / "turnout", pack_dir)
    before = Pack(compile_pack(pack_dir))
    served = (before.served_architectures or {})["generate"]
    candidates = [
        a
        for a, info in sorted(before.architectures.items())
        if info.runner_kind == "generate" and a not in served
    ]
    arch = "MambaForCausalLM" if "MambaForCausalLM" in candidates else candidates[0]
    cfg = DeploymentConfig(architecture=arch, platform="cuda")
    assert decide(cfg, pack=before).error_code == "architecture_not_served"

    monkeypatch.setattr(
        model_config, "SUPPORTED_ARCHITECTURES", (*model_config.SUPPORTED_ARCHITECTURES, arch)
    )
    rebuilt = {
        name: RunnerManifest.build(
            name,
            architectures=capabilities.model_layer_architectures(),
            refused=m.refused,
            speculative_methods=m.speculative_methods,
            pooling_tasks=m.pooling_tasks,
            platforms=m.platforms,
            requires_triton=m.requires_triton,
            async_scheduling=m.async_scheduling,
            cuda_graphs=m.cuda_graphs,
        )
        for name, m in live_manifests().items()
    }
    assert all(arch in m.architectures_for("generate") for m in rebuilt.values())
    (pack_dir / "manifests.json").write_text(capabilities.render(rebuilt))
    after = Pack(compile_pack(pack_dir))
    d = decide(cfg, pack=after)
    assert d.error_code is None and d.runner in ("v1", "v2")
    assert d.family == before.architectures[arch].family
    assert after.digest != before.digest  # the manifests are part of the pack's content
