"""The LLM facade: one oracle decision from the arguments and the machine, logged in vLLM's
shapes; the runner built by name; pins; bad requests rejected alone; outputs assembled."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.errors import EngineConfigError, NoRunnerError
from turnout.engine.llm import LLM
from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams

CPU_WARNING = (
    "Model Runner V2 does not yet support the CPU platform (V2 runs there only through the "
    "Triton interpreter); using the V1 model runner instead."
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("facade-llama")
    write_random_weights(TINY_DECODER_CONFIGS["llama"], path, dtype=torch.float32, seed=3)
    return path


def test_decision_is_made_once_and_logged(
    llama_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="turnout.engine"):
        llm = LLM(llama_dir, device="cpu", max_model_len=128, environ={})
    assert llm.runner_name == "v1" and llm.decision.mode == "auto"
    assert [r.rule_id for r in llm.decision.reasons] == ["cpu_platform"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [CPU_WARNING]
    assert llm.deployment.architecture == "LlamaForCausalLM" and llm.deployment.platform == "cpu"
    assert type(llm.core.runner).__module__ == "turnout.runner_v1.model_runner"


def test_features_reach_the_oracle(llama_dir: Path) -> None:
    def boost(out_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        return logits

    llm = LLM(
        llama_dir,
        device="cpu",
        max_model_len=128,
        environ={},
        cpu_offload_gb=1e-4,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
        logits_processors=[boost],
    )
    dep = llm.deployment
    assert (dep.speculative_method, dep.num_speculative_tokens, dep.cpu_offload_gb) == (
        "ngram",
        2,
        1e-4,
    )
    assert dep.logits_processors == (f"{__name__}.test_features_reach_the_oracle.<locals>.boost",)
    rules = {r.rule_id for r in llm.decision.reasons}
    assert {"cpu_platform"} < rules and len(rules) == 4
    assert llm.core.runner.offload_stats.num_offloaded_layers == 1


def test_pins_and_the_environment(llama_dir: Path) -> None:
    pinned = LLM(
        llama_dir,
        "v1",
        device="cpu",
        max_model_len=128,
        environ={"TURNOUT_USE_V2_MODEL_RUNNER": "1"},
    )
    assert (pinned.decision.mode, pinned.runner_name) == ("pinned", "v1")
    from_env = LLM(
        llama_dir, device="cpu", max_model_len=128, environ={"TURNOUT_USE_V2_MODEL_RUNNER": "0"}
    )
    assert (from_env.decision.mode, from_env.runner_name) == ("pinned", "v1")
    with pytest.raises(
        NoRunnerError,
        match=r"no runner can serve this deployment: Model Runner V2 does not yet support: speculative method 'ngram'",
    ):
        LLM(
            llama_dir,
            "v2",
            device="cpu",
            max_model_len=128,
            speculative_config={"method": "ngram"},
            environ={},
        )
    with pytest.raises(
        EngineConfigError,
        match=r"unknown engine arguments \['max_num_seq'\]; known: .*max_num_seqs",
    ):
        LLM(llama_dir, device="cpu", environ={}, max_num_seq=4)
    with pytest.raises(EngineConfigError, match="runner must be one of auto, v1, v2"):
        LLM(llama_dir, "v3", device="cpu", environ={})
    with pytest.raises(
        EngineConfigError, match="TURNOUT_USE_V2_MODEL_RUNNER must be unset, 0 or 1; got 'yes'"
    ):
        LLM(llama_dir, device="cpu", environ={"TURNOUT_USE_V2_MODEL_RUNNER": "yes"})


def test_generate_rejects_bad_prompts_alone(llama_dir: Path) -> None:
    llm = LLM(llama_dir, device="cpu", max_model_len=64, max_logprobs=5, environ={})
    greedy = SamplingParams(
        max_tokens=5, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    prompts = [[5, 6, 7, 8], list(range(3, 80)), "text needs a tokenizer", [9, 10, 11]]
    outs = llm.generate(prompts, greedy)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error", "error", "length"]
    assert "77 tokens, more than max_model_len=64" in outs[1].error
    assert (
        "has no tokenizer: pass token ids" in outs[2].error
        and outs[2].prompt == "text needs a tokenizer"
    )
    alone = llm.generate([[9, 10, 11]], greedy)[0]
    assert (
        outs[3].outputs[0].token_ids == alone.outputs[0].token_ids
        and len(alone.outputs[0].token_ids) == 5
    )
    lp = outs[0].outputs[0].logprobs
    assert (
        lp.token_ids.shape == (5, 3) and lp.token_ids[:, 0].tolist() == outs[0].outputs[0].token_ids
    )
    assert outs[0].prompt_logprobs.token_ids[:, 0].tolist() == [6, 7, 8]
    bad_k = llm.generate([[5, 6]], SamplingParams(logprobs=6))[0]
    assert "logprobs=6 is above the engine's max_logprobs=5" in bad_k.error
    # One prompt as a numpy array, then a batch of them: the same tokens as lists.
    as_numpy = llm.generate(np.asarray([9, 10, 11]), greedy)
    assert len(as_numpy) == 1 and as_numpy[0].outputs[0].token_ids == alone.outputs[0].token_ids
    batch = llm.generate(
        [np.asarray([5, 6, 7, 8]), np.asarray([9, 10, 11], dtype=np.int32)], greedy
    )
    assert [o.outputs[0].token_ids for o in batch] == [
        outs[0].outputs[0].token_ids,
        alone.outputs[0].token_ids,
    ]
    # Items that are neither text nor token ids fail alone (they failed the whole call).
    odd = llm.generate([[9, 10, 11], 7, None, [[1]]], greedy)
    assert [o.outputs[0].finish_reason for o in odd] == ["length", "error", "error", "error"]
    assert "a prompt is text or a list of token ids, got 7" in odd[1].error
    assert "token ids must be integers, got [1] (list)" in odd[3].error


def test_a_conversation_the_chat_template_rejects_fails_alone(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    # The template raising on one conversation (a message without "content", content that is
    # not text) failed the whole chat() call before any request was made.
    write_random_weights(
        {**TINY_DECODER_CONFIGS["llama"], "vocab_size": 49152},
        tmp_path,
        dtype=torch.float32,
        seed=1,
    )
    llm = LLM(tmp_path, device="cpu", tokenizer=smollm2_gguf, max_model_len=128, environ={})
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    good = [{"role": "user", "content": "Hello"}]
    outs = llm.chat([good, [{"role": "user"}], [{"role": "user", "content": 5}], good], greedy)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error", "error", "length"]
    assert "chat template" in outs[1].error and "has no attribute 'content'" in outs[1].error
    assert "chat template" in outs[2].error
    assert (
        outs[0].outputs[0].token_ids
        == outs[3].outputs[0].token_ids
        == llm.chat(good, greedy)[0].outputs[0].token_ids
    )
    assert outs[0].prompt.endswith("<|im_start|>assistant\n") and outs[1].prompt is None


def test_generate_and_embed_are_checked_against_the_model(llama_dir: Path) -> None:
    llm = LLM(llama_dir, device="cpu", max_model_len=64, environ={})
    with pytest.raises(
        EngineConfigError,
        match=r"is not a pooling model \(LlamaForCausalLM generates text\): "
        r"it does not serve the 'embed' task; use generate\(\)",
    ):
        llm.embed(["hello"])


def test_seeded_generation_is_reproducible(llama_dir: Path) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    runs = [
        LLM(llama_dir, device="cpu", max_model_len=64, environ={}).generate([[4, 5, 6]], params)[0]
        for _ in range(2)
    ]
    assert runs[0].outputs[0].token_ids == runs[1].outputs[0].token_ids
    unseeded = [
        LLM(llama_dir, device="cpu", max_model_len=64, environ={}, seed=s).generate(
            [[4, 5, 6]], SamplingParams(max_tokens=12)
        )[0]
        for s in (1, 1, 2)
    ]
    assert unseeded[0].outputs[0].token_ids == unseeded[1].outputs[0].token_ids
    assert not np.array_equal(unseeded[0].outputs[0].token_ids, unseeded[2].outputs[0].token_ids)


def test_gguf_reports_its_quantization_to_the_oracle(smollm2_gguf: Path) -> None:
    # The shipped SmolLM2 file is Q4_1: the deployment is quantized ("gguf", vLLM's name), so
    # the rollout puts it in the quantized stage. These are LLM.__init__'s steps up to the
    # decision, from the header alone (loading the weights is test_smollm2_gguf's; the FP8
    # facade test, tests/parity/test_parity_fp8.py, runs the whole constructor).
    from turnout.engine.model_info import engine_config_for, read_model_config
    from turnout.engine.runner_selection import choose_runner, deployment_config
    from turnout.oracle import load_pack

    model_config = read_model_config(smollm2_gguf)
    pack = load_pack("turnout")
    dep = deployment_config(
        engine_config_for(smollm2_gguf, model_config, device="cpu"),
        model_config.architecture,
        runner="auto",
        pack=pack,
        environ={},
        quantization=model_config.quantization_method,
    )
    assert dep.quantization == "gguf"
    assert choose_runner(dep, pack=pack).stage == "quantized"
