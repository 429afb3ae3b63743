"""The MoE architectures (Qwen2-MoE, Qwen3-MoE, GraniteMoe) on every runner against HF
transformers, on checkpoints transformers itself wrote from configs shrunk from the real ones
(fp32, CPU): greedy tokens equal HF's argmaxes, logprobs and prompt logprobs within 1e-4,
through chunked prefill mixed with decodes; and the ``LLM`` facade decides a runner, loads
and generates each family on both runners."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY_MOE_CONFIGS, make_engine, prompts_for, run
from reference import load_hf

from turnout.engine.llm import LLM
from turnout.engine.sampling_params import SamplingParams

pytest.importorskip("transformers")
NUM_NEW = 6
ARCHITECTURES = {name: cfg["architectures"][0] for name, cfg in TINY_MOE_CONFIGS.items()}


def _hf_argmax_and_logprobs(hf: object, sequence: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.no_grad():
        logprobs = hf(torch.tensor([sequence[:-1]])).logits[0].float().log_softmax(-1)  # type: ignore[operator]
    return logprobs.argmax(-1).tolist(), logprobs


@pytest.mark.parametrize("name", sorted(TINY_MOE_CONFIGS))
def test_greedy_tokens_and_logprobs_equal_hf(
    runner_name: str, name: str, moe_dirs: dict[str, Path]
) -> None:
    path = moe_dirs[name]
    hf = load_hf(path)
    prompts = prompts_for(TINY_MOE_CONFIGS[name]["vocab_size"], [5, 13, 30])
    params = SamplingParams(
        max_tokens=NUM_NEW, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    # A small token budget and block size: chunked prefill mixed with decodes, scattered blocks.
    core = make_engine(runner_name, path, max_num_batched_tokens=16, block_size=4)
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        sequence = prompt + req.output_token_ids
        argmax, ref = _hf_argmax_and_logprobs(hf, sequence)
        # greedy = the argmax given the prefix, so equal argmaxes are equal HF generate tokens
        assert req.output_token_ids == argmax[len(prompt) - 1 :], (
            f"{name}/r{i}: greedy tokens differ from HF"
        )
        positions = torch.arange(len(sequence) - 1)
        want = ref[positions, torch.tensor(sequence[1:])]
        got = [lp for chunk in req.logprobs for lp in chunk.sampled_logprobs()]
        torch.testing.assert_close(torch.tensor(got), want[len(prompt) - 1 :], atol=1e-4, rtol=0)
        got_prompt = torch.tensor([lp for c in req.prompt_logprobs for lp in c.sampled_logprobs()])
        torch.testing.assert_close(got_prompt, want[: len(prompt) - 1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", sorted(TINY_MOE_CONFIGS))
def test_llm_decides_loads_and_generates_on_both_runners(
    name: str, moe_dirs: dict[str, Path]
) -> None:
    path = moe_dirs[name]
    prompt = prompts_for(TINY_MOE_CONFIGS[name]["vocab_size"], [9], seed=3)[0]
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    tokens = {}
    for pin in ("auto", "v2"):
        llm = LLM(path, pin, device="cpu", max_model_len=64, environ={})
        assert llm.deployment.architecture == ARCHITECTURES[name]
        # the oracle's choice on a CPU is runner_v1; a pin to runner_v2 is honoured
        assert llm.runner_name == {"auto": "v1", "v2": "v2"}[pin]
        assert type(llm.core.runner).__module__.startswith(f"turnout.runner_{llm.runner_name}.")
        tokens[llm.runner_name] = llm.generate([prompt], greedy)[0].outputs[0].token_ids
    argmax, _ = _hf_argmax_and_logprobs(load_hf(path), prompt + tokens["v1"])
    assert tokens["v1"] == tokens["v2"] == argmax[len(prompt) - 1 :]
