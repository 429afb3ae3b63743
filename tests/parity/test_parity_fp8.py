"""FP8 checkpoints on both runners (CPU, fp32 activations: the dequantising reference) against HF
transformers on the dequantised weights: greedy tokens equal, logprobs within 1e-4; and
``LLM(dir)`` reports the checkpoint's quantization to the oracle and logs how the weights run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_DECODER_CONFIGS, make_engine, prompts_for, run
from reference import load_hf, reference_generate

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from fp8_formats import write_fp8_pair

from turnout.engine.sampling_params import SamplingParams

pytest.importorskip("transformers")

CASES = [("llama", "fp8-tensor-static"), ("qwen3", "ct-channel-dynamic")]


@pytest.fixture(scope="module")
def fp8_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Path, Path]]:
    return {
        case: write_fp8_pair(
            TINY_DECODER_CONFIGS[case[0]], case[1], tmp_path_factory.mktemp("-".join(case))
        )
        for case in CASES
    }


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_greedy_tokens_and_logprobs_equal_hf(
    runner_name: str, case: tuple[str, str], fp8_dirs: dict
) -> None:
    fp8_dir, dense_dir = fp8_dirs[case]
    hf = load_hf(dense_dir)
    prompts = prompts_for(TINY_DECODER_CONFIGS[case[0]]["vocab_size"], [5, 13, 30])
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=1)
    core = make_engine(runner_name, fp8_dir, max_num_batched_tokens=16, block_size=4)
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        ref = reference_generate(hf, prompt, params.with_seed(0), set(), 10**6)
        assert req.output_token_ids == ref.token_ids, f"{case}/r{i}"
        got = [lp for chunk in req.logprobs for lp in chunk.sampled_logprobs()]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)


def test_llm_reports_fp8_to_the_oracle(fp8_dirs: dict, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pydantic")  # the oracle
    from turnout.engine.llm import LLM

    for (_, fmt), (fp8_dir, _) in fp8_dirs.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="turnout.engine"):
            llm = LLM(fp8_dir, device="cpu", max_model_len=64, kv_cache_memory_gb=0.01, environ={})
        method = "fp8" if fmt.startswith("fp8") else "compressed-tensors"
        assert llm.deployment.quantization == method
        assert (
            llm.decision.stage == "quantized"
        )  # the rollout's quantized cohort, whatever the family
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("weights: ")]
        assert len(lines) == 1 and lines[0].startswith(f"weights: {method} (")
        assert lines[0].endswith("dequantised to float32 per matmul (cpu: no FP8 matmul)")
