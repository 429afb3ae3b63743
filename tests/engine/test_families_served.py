"""Every architecture of the turnout pack's families.yaml is either served by the runner the
oracle decides, or refused by the oracle itself: nothing is promised that then fails to load.

For each architecture, on this machine (``platform=cpu``), under each runner pin (auto, V1,
V2): either every decision is the oracle's ``architecture_not_served`` refusal, or none is, and
then a tiny random-weight model of that architecture (tests/engine/model/tiny_model_configs.py)
is loaded by every runner decided and runs one step there through ``LLM``: one greedy token for
a decoder, one output of its first pooling task for a pooling model (an embedding, or
classification logits). An architecture a runner's manifest serves without a
tiny config here fails, naming the file to add one to.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "model"))
from tiny_model_configs import tiny_config_for

pytest.importorskip("pydantic")  # the oracle

from turnout.engine.llm import LLM
from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams
from turnout.oracle import DeploymentConfig, decide, load_pack

PACK = load_pack("turnout")
ARCHITECTURES = sorted(PACK.architectures)
PINS = ("auto", "v1", "v2")


def _decisions(arch: str) -> dict[str, object]:
    return {
        pin: decide(
            DeploymentConfig(
                architecture=arch, platform="cpu", env=PACK.pin_env(None if pin == "auto" else pin)
            ),
            pack=PACK,
        )
        for pin in PINS
    }


def test_some_architectures_are_served_and_most_are_refused() -> None:
    served = [
        a for a in ARCHITECTURES if _decisions(a)["auto"].error_code != "architecture_not_served"
    ]
    assert {
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "BertModel",
        "MambaForCausalLM",
        "BertForSequenceClassification",
        "LlamaForSequenceClassification",
        "JambaForCausalLM",
    } <= set(served)
    assert {
        "Mamba2ForCausalLM",
        "FalconMambaForCausalLM",
        "XLMRobertaForSequenceClassification",
    }.isdisjoint(served)
    assert len(served) < len(ARCHITECTURES) // 10


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_family_architecture_is_served_or_refused(arch: str, tmp_path: Path) -> None:
    decisions = _decisions(arch)
    refused = {pin for pin, d in decisions.items() if d.error_code == "architecture_not_served"}
    if refused:
        assert refused == set(PINS), f"{arch}: refused under {sorted(refused)} only"
        d = decisions["auto"]
        assert d.runner is None and f"serves architecture {arch!r}" in (d.error or "")
        return
    runners = {d.runner for d in decisions.values()}
    assert runners == {"v1", "v2"}, {pin: (d.runner, d.error) for pin, d in decisions.items()}
    cfg = tiny_config_for(arch)
    assert cfg is not None, (
        f"{arch} is served by a runner: add a tiny config of it to "
        "tests/engine/model/tiny_model_configs.py"
    )
    write_random_weights(cfg, tmp_path, dtype=torch.float32, seed=11)
    for runner in sorted(runners):
        llm = LLM(tmp_path, runner, device="cpu", max_model_len=64, environ={})
        assert llm.decision.runner == runner
        assert type(llm.core.runner).__module__.startswith(f"turnout.runner_{runner}.")
        prompt = [5, 9, 14, 3, 7]
        if llm.config.runner_kind == "pooling" and llm.config.pooling_tasks[0] == "embed":
            (out,) = llm.embed([prompt])
            assert out.error is None and out.embedding is not None
            assert len(out.embedding) == cfg["hidden_size"]
            assert abs(sum(x * x for x in out.embedding) - 1.0) < 1e-4
        elif llm.config.runner_kind == "pooling":
            assert llm.config.pooling_tasks[0] == "classify"
            (c,) = llm.classify([prompt])
            assert (
                c.error is None and c.logits is not None and len(c.logits) == len(cfg["id2label"])
            )
            assert abs(sum(c.probs) - 1.0) < 1e-6 or len(c.logits) == 1
        else:
            (out,) = llm.generate(
                [prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
            )
            assert out.outputs[0].finish_reason == "length"
            assert (
                len(out.outputs[0].token_ids) == 1
                and 0 <= out.outputs[0].token_ids[0] < cfg["vocab_size"]
            )
