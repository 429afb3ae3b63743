"""enumerate_matrix() and diff_matrix(): every cell decided, every rule firing somewhere."""

from __future__ import annotations

from collections import Counter

from turnout.oracle import enumerate_matrix, load_pack
from turnout.oracle.matrix import scenarios
from turnout.oracle.matrix_diff import diff_matrix


def test_every_rule_fires_in_the_grid() -> None:
    for name in ("turnout", "vllm-0.31"):
        pack = load_pack(name)
        fired = {
            r.rule_id
            for c in enumerate_matrix(
                pack,
                architectures=[
                    "Qwen3ForCausalLM",
                    "DeepseekV32ForCausalLM",
                    "LLaDAModelLM",
                    "JambaForCausalLM",
                    "WhisperForConditionalGeneration",
                    "Mamba2ForCausalLM",
                ],
            )
            for r in c.decision.reasons
        }
        missing = {r.id for r in pack.rules} - fired
        assert not missing, (name, missing)


def test_cells_are_every_architecture_pin_and_scenario() -> None:
    pack = load_pack("turnout")
    cols = scenarios(pack)
    cells = list(enumerate_matrix(pack))
    assert len(cells) == len(pack.architectures) * 3 * len(cols)
    assert len({c.key for c in cells}) == len(cells)
    by_pin = Counter(c.pin for c in cells if c.decision.runner is None)
    assert by_pin["auto"] < by_pin["v2"]  # pins to V2 on blocked cells are errors
    witness = next(
        c
        for c in cells
        if c.scenario.id == "rule:external_launcher_pipeline"
        and c.architecture == "Qwen3ForCausalLM"
        and c.pin == "auto"
    )
    assert witness.config.pipeline_parallel_size == 2
    assert witness.config.distributed_executor_backend == "external_launcher"
    assert [r.rule_id for r in witness.decision.reasons] == ["external_launcher_pipeline"]


def test_diff_shows_cells_that_change_runner() -> None:
    changes = list(diff_matrix(load_pack("turnout"), load_pack("vllm-0.31")))
    assert changes
    qwen_eagle = [
        c
        for c in changes
        if c.architecture == "Qwen3ForCausalLM"
        and c.pin == "auto"
        and c.scenario == "speculative_method=eagle"
    ]
    assert len(qwen_eagle) == 1
    # turnout's runners implement no EAGLE drafter: no runner (vLLM 0.31: V2).
    assert (qwen_eagle[0].before.runner, qwen_eagle[0].after.runner) == (None, "v2")
    assert qwen_eagle[0].before.error_code == "no_runner"
    # runner_v2 matches n-grams on the device; vLLM 0.31's V2 did not (V1 there).
    gpu_ngram = [
        c
        for c in changes
        if c.architecture == "Qwen3ForCausalLM"
        and c.pin == "auto"
        and c.scenario == "speculative_method=ngram_gpu"
    ]
    assert [(c.before.runner, c.after.runner) for c in gpu_ngram] == [("v2", "v1")]
    assert not [
        c
        for c in changes
        if c.architecture == "Qwen3ForCausalLM"
        and c.pin == "auto"
        and c.scenario == "speculative_method=draft_model"
    ]  # V2 under both
    mamba = [
        c
        for c in changes
        if c.architecture == "Mamba2ForCausalLM" and c.pin == "auto" and c.scenario == "default"
    ]
    assert len(mamba) == 1 and mamba[0].before.error_code == "architecture_not_served"
    same = [
        c
        for c in changes
        if c.architecture == "Qwen3ForCausalLM"
        and c.pin == "auto"
        and c.scenario == "speculative_method=ngram"
    ]
    assert same == []  # V1 under both packs
