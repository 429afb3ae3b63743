"""explain(): the smallest changes that reach V2, each really reaching it."""

from __future__ import annotations

from turnout.oracle import CanarySnapshot, CohortState, DeploymentConfig, explain, load_pack


def _texts(cfg: DeploymentConfig, **kw: object) -> list[str]:
    return [str(s) for s in explain(cfg, pack=load_pack("turnout"), **kw).suggestions]


def test_a_value_that_keeps_the_feature_on_comes_first() -> None:
    # vLLM 0.31's V2 has other drafters; turnout's runner_v2 implements ngram_gpu and
    # draft_model (its manifest), so under the turnout pack n-gram speculation moves to the
    # device rather than off. ngram_gpu alone reaches V2 even outside a stage that is on:
    # runner_v1 cannot serve it.
    cfg = DeploymentConfig(architecture="Qwen3ForCausalLM", speculative_method="ngram")
    ex = explain(cfg, pack=load_pack("vllm-0.31"))
    assert ex.decision.runner == "v1"
    assert str(ex.suggestions[0]) == "speculative_method ngram → draft_model"
    assert all(s.decision.runner == "v2" for s in ex.suggestions)
    ex = explain(cfg, pack=load_pack("turnout"))
    assert ex.decision.runner == "v1"
    assert [str(s) for s in ex.suggestions] == ["speculative_method ngram → ngram_gpu"]
    assert ex.suggestions[0].decision.runner == "v2"


def test_two_blockers_need_both_changes() -> None:
    cfg = DeploymentConfig(
        architecture="Qwen3ForCausalLM", speculative_method="suffix", enable_elastic_ep=True
    )
    # The nearest served method keeps speculation on (ngram_gpu: runner_v2's own).
    assert _texts(cfg) == ["speculative_method suffix → ngram_gpu; enable_elastic_ep true → false"]


def test_soft_blocker_offers_the_pin() -> None:
    cfg = DeploymentConfig(architecture="Qwen3ForCausalLM", enable_dbo=True)
    texts = _texts(cfg)
    assert texts == ["enable_dbo true → false", "env:TURNOUT_USE_V2_MODEL_RUNNER unset → 1"]


def test_stage_off_offers_pin_and_canary() -> None:
    cfg = DeploymentConfig(architecture="LlamaForCausalLM")
    ex = explain(cfg, pack=load_pack("turnout"))
    assert [s.kind for s in ex.suggestions] == ["pin", "canary"]
    assert str(ex.suggestions[1]) == "canary:llama-mistral-dense off → on 100%"


def test_kill_switch_is_named_in_the_canary_change() -> None:
    cfg = DeploymentConfig(architecture="Qwen3ForCausalLM")
    texts = _texts(cfg, canaries=CanarySnapshot({}, kill_switch=True))
    # qwen3-canary is on by default (rollout.yaml): releasing the kill switch is all it takes.
    assert texts == ["env:TURNOUT_USE_V2_MODEL_RUNNER unset → 1", "kill_switch engaged → released"]
    llama = DeploymentConfig(architecture="LlamaForCausalLM")
    assert (
        _texts(llama, canaries=CanarySnapshot({}, kill_switch=True))[1]
        == "kill_switch engaged → released; canary:llama-mistral-dense off → on 100%"
    )


def test_canary_change_starts_from_the_effective_state() -> None:
    cfg = DeploymentConfig(architecture="LlamaForCausalLM", deployment_id="dep-7")
    split = CanarySnapshot({"llama-mistral-dense": CohortState(True, 1)})
    assert _texts(cfg, canaries=split)[1] == "canary:llama-mistral-dense 1% → on 100%"


def test_v1_pin_is_lifted_first() -> None:
    pin = {"TURNOUT_USE_V2_MODEL_RUNNER": "0"}
    qwen = DeploymentConfig(architecture="Qwen3ForCausalLM", env=pin)
    assert _texts(qwen) == ["env:TURNOUT_USE_V2_MODEL_RUNNER 0 → 1"]
    ngram = DeploymentConfig(architecture="Qwen3ForCausalLM", speculative_method="ngram", env=pin)
    ex = explain(ngram, pack=load_pack("turnout"))
    assert ex.decision.mode == "pinned" and ex.decision.runner == "v1"
    assert str(ex.suggestions[0]) == (
        "env:TURNOUT_USE_V2_MODEL_RUNNER 0 → unset; speculative_method ngram → ngram_gpu"
    )
    assert ex.suggestions[0].decision.runner == "v2" and ex.suggestions[0].decision.mode == "auto"


def test_pinned_error_is_fixed_under_the_pin() -> None:
    cfg = DeploymentConfig(
        architecture="Qwen3ForCausalLM", cpu_offload_gb=8, env={"TURNOUT_USE_V2_MODEL_RUNNER": "1"}
    )
    ex = explain(cfg, pack=load_pack("turnout"))
    assert ex.decision.runner is None
    assert [str(s) for s in ex.suggestions] == ["cpu_offload_gb 8.0 → 0"]
    assert ex.suggestions[0].decision.mode == "pinned"


def test_model_facts_are_not_suggested() -> None:
    cfg = DeploymentConfig(architecture="Qwen3ForCausalLM", triton_available=False)
    assert _texts(cfg) == ["triton_available false → true"]
    moe = DeploymentConfig(architecture="Qwen3ForCausalLM", is_moe=True)  # stage all-families, off
    texts = _texts(moe)
    assert texts and all("is_moe" not in t and "architecture" not in t for t in texts)


def test_an_architecture_no_runner_serves_has_no_suggestion() -> None:
    ex = explain(
        DeploymentConfig(architecture="Mamba2ForCausalLM", speculative_method="ngram"),
        pack=load_pack("turnout"),
    )
    assert ex.decision.error_code == "architecture_not_served" and ex.suggestions == ()
    assert ex.note.startswith(
        "no change of the deployment's options reaches a runner: no runner "
        "of this build serves architecture 'Mamba2ForCausalLM'"
    )


def test_already_v2_and_unknown_architecture() -> None:
    pack = load_pack("turnout")
    assert (
        explain(DeploymentConfig(architecture="Qwen3ForCausalLM"), pack=pack).note == "already V2"
    )
    ex = explain(DeploymentConfig(architecture="Nope"), pack=pack)
    assert ex.suggestions == () and ex.note.startswith("fix the input first")


PIN = "env:TURNOUT_USE_V2_MODEL_RUNNER"
LLAMA_STAGE = "canary:llama-mistral-dense off → on 100%"


def test_a_blocker_in_a_stage_that_is_off_needs_the_change_and_a_step_together() -> None:
    # The Llama stage is off and CPU weight offload blocks V2: neither the config change nor
    # the canary (nor the pin: offload is a hard blocker) reaches V2 alone.
    cfg = DeploymentConfig(architecture="LlamaForCausalLM", cpu_offload_gb=4)
    ex = explain(cfg, pack=load_pack("turnout"))
    assert ex.note == ""
    assert [(s.kind, str(s)) for s in ex.suggestions] == [
        ("config+pin", f"cpu_offload_gb 4.0 → 0; {PIN} unset → 1"),
        ("config+canary", f"cpu_offload_gb 4.0 → 0; {LLAMA_STAGE}"),
    ]
    assert [s.decision.mode for s in ex.suggestions] == ["pinned", "auto"]
    assert all(s.decision.runner == "v2" for s in ex.suggestions)


def test_two_blockers_and_the_canary_in_one_suggestion() -> None:
    cfg = DeploymentConfig(
        architecture="LlamaForCausalLM", cpu_offload_gb=4, enable_elastic_ep=True
    )
    assert (
        _texts(cfg)[1] == f"enable_elastic_ep true → false; cpu_offload_gb 4.0 → 0; {LLAMA_STAGE}"
    )


def test_a_step_that_works_alone_is_not_combined() -> None:
    # DBO is soft: the pin alone reaches V2, so no config+pin; the canary needs DBO off.
    cfg = DeploymentConfig(architecture="LlamaForCausalLM", enable_dbo=True)
    ex = explain(cfg, pack=load_pack("turnout"))
    assert [(s.kind, str(s)) for s in ex.suggestions] == [
        ("pin", f"{PIN} unset → 1"),
        ("config+canary", f"enable_dbo true → false; {LLAMA_STAGE}"),
    ]


def test_combined_steps_start_from_a_v1_pin_and_the_kill_switch() -> None:
    pin = {"TURNOUT_USE_V2_MODEL_RUNNER": "0"}
    cfg = DeploymentConfig(architecture="LlamaForCausalLM", cpu_offload_gb=4, env=pin)
    assert _texts(cfg) == [
        f"cpu_offload_gb 4.0 → 0; {PIN} 0 → 1",
        f"{PIN} 0 → unset; cpu_offload_gb 4.0 → 0; {LLAMA_STAGE}",
    ]
    qwen = DeploymentConfig(architecture="Qwen3ForCausalLM", cpu_offload_gb=4)
    assert _texts(qwen, canaries=CanarySnapshot({}, kill_switch=True)) == [
        f"cpu_offload_gb 4.0 → 0; {PIN} unset → 1",
        "cpu_offload_gb 4.0 → 0; kill_switch engaged → released",
    ]
    # Under the kill switch a method only V2 serves still reaches V2 by itself.
    assert (
        _texts(
            DeploymentConfig(architecture="Qwen3ForCausalLM", speculative_method="ngram"),
            canaries=CanarySnapshot({}, kill_switch=True),
        )[0]
        == "speculative_method ngram → ngram_gpu"
    )


def test_a_blocker_behind_a_prerequisite_is_found() -> None:
    # Without Triton the decision names only the prerequisite (it decides first); explain
    # said "no change of the deployment's options reaches V2" although one did.
    qwen = DeploymentConfig(
        architecture="Qwen3ForCausalLM", triton_available=False, mamba_cache_mode="all"
    )
    assert _texts(qwen) == ["triton_available false → true; mamba_cache_mode all → none"]
    llama = DeploymentConfig(
        architecture="LlamaForCausalLM", triton_available=False, cpu_offload_gb=4
    )
    ex = explain(llama, pack=load_pack("turnout"))
    assert [r.rule_id for r in ex.decision.reasons] == ["triton_required"]
    assert [(s.kind, str(s)) for s in ex.suggestions] == [
        (
            "config+pin",
            "triton_available false → true; cpu_offload_gb 4.0 → 0; "
            "env:TURNOUT_USE_V2_MODEL_RUNNER unset → 1",
        ),
        (
            "config+canary",
            "triton_available false → true; cpu_offload_gb 4.0 → 0; "
            "canary:llama-mistral-dense off → on 100%",
        ),
    ]
    assert all(s.decision.runner == "v2" for s in ex.suggestions)


def test_a_soft_blocker_behind_a_prerequisite_is_found_for_the_canary_too() -> None:
    # DBO is allowed under a V2 pin; the rollout path has to turn it off as well.
    cfg = DeploymentConfig(architecture="LlamaForCausalLM", triton_available=False, enable_dbo=True)
    assert _texts(cfg) == [
        "triton_available false → true; env:TURNOUT_USE_V2_MODEL_RUNNER unset → 1",
        "triton_available false → true; enable_dbo true → false; "
        "canary:llama-mistral-dense off → on 100%",
    ]
