"""OPT on both runners against HF transformers on HF's own random weights (fp32): greedy tokens
equal HF ``generate``, logprobs and prompt logprobs within 1e-4, through chunked prefill mixed
with decodes; and ``LLM(dir)`` on the CPU asks the oracle, builds the runner it names, loads
OPT and generates what HF generates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import make_engine, prompts_for, run
from reference import load_hf, prompt_logprobs, reference_generate

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_opt_configs import TINY_OPT_CONFIGS, write_hf_opt

from turnout.engine.sampling_params import SamplingParams

pytest.importorskip("transformers")

NUM_NEW = 6
#: pre-LN (opt-125m), and opt-350m's post-LN with project_in/project_out (the model-layer test,
#: tests/engine/model/test_opt.py, runs every variant; the runners add nothing per variant).
VARIANTS = ["opt-pre-ln", "opt-post-ln-project"]


@pytest.fixture(scope="module")
def opt_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: write_hf_opt(TINY_OPT_CONFIGS[name], tmp_path_factory.mktemp(name), seed=9)
        for name in VARIANTS
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_and_logprobs_equal_hf(
    runner_name: str, variant: str, opt_dirs: dict[str, Path]
) -> None:
    path = opt_dirs[variant]
    hf = load_hf(path)
    prompts = prompts_for(TINY_OPT_CONFIGS[variant]["vocab_size"], [5, 13, 30])
    params = SamplingParams(
        max_tokens=NUM_NEW, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    core = make_engine(
        runner_name, path, max_model_len=128, max_num_batched_tokens=16, block_size=4
    )
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW, do_sample=False)[
                0
            ].tolist()
        assert prompt + req.output_token_ids == want, (
            f"{variant}/r{i}: greedy tokens differ from HF generate"
        )
        ref = reference_generate(hf, prompt, params.with_seed(0), set(), 10**6)
        got = [lp for chunk in req.logprobs for lp in chunk.sampled_logprobs()]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)
        got_prompt = torch.tensor([lp for c in req.prompt_logprobs for lp in c.sampled_logprobs()])
        torch.testing.assert_close(got_prompt, prompt_logprobs(hf, prompt), atol=1e-4, rtol=0)


@pytest.mark.parametrize("runner", ["auto", "v2"])
def test_llm_decides_loads_and_generates_opt(runner: str, opt_dirs: dict[str, Path]) -> None:
    pytest.importorskip("pydantic")  # the oracle
    from turnout.engine.llm import LLM

    path = opt_dirs["opt-post-ln-project"]
    llm = LLM(path, runner, device="cpu", max_model_len=128, kv_cache_memory_gb=0.01, environ={})
    dep, decision = llm.deployment, llm.decision
    assert (dep.architecture, dep.quantization, decision.family) == (
        "OPTForCausalLM",
        "none",
        "opt",
    )
    # auto on the CPU: V1 (V2 runs there only through the Triton interpreter); a pin is honoured.
    assert llm.runner_name == ("v1" if runner == "auto" else "v2")
    assert type(llm.core.runner).__module__.startswith(f"turnout.runner_{llm.runner_name}.")
    prompt = prompts_for(TINY_OPT_CONFIGS["opt-post-ln-project"]["vocab_size"], [11], seed=3)[0]
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    hf = load_hf(path)
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0].tolist()
    assert prompt + out.outputs[0].token_ids == want
