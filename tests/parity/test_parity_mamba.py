"""Mamba-1 on both runners against HF transformers on HF's own random weights (fp32, CPU), and the
docs/architecture.md §5.5 contracts on its per-request state: greedy tokens equal HF ``generate``
with chunked prefill on and off and under forced preemption; prompt and sampled logprobs within
1e-4; seeded samples and prompt logprobs independent of chunking and preemption; a reused state slot
carries nothing over; the options the state rules out are refused by name (prefix caching turned
off, said in the log); and ``LLM(dir)`` asks the oracle, builds the runner it names and generates
what HF generates."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_engine, prompts_for, run
from reference import load_hf, prompt_logprobs, reference_generate

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_mamba_configs import TINY_MAMBA, write_hf_mamba

from turnout.engine.errors import EngineConfigError
from turnout.engine.model.state_cache import MambaState
from turnout.engine.sampling_params import SamplingParams

pytest.importorskip("transformers")

VOCAB = TINY_MAMBA["vocab_size"]
NUM_NEW = 6
#: EngineConfig variants every greedy case runs under: chunked prefill with a small token
#: budget, chunked prefill off, and a block pool small enough to preempt (blocks of an
#: attention-free model cost no memory, but the scheduler still counts them).
SCHEDULES: dict[str, dict[str, Any]] = {
    "chunked": {"max_num_batched_tokens": 16},
    "unchunked": {"enable_chunked_prefill": False, "max_num_batched_tokens": 128},
    "preempted": {"max_num_batched_tokens": 16, "block_size": 4, "num_kv_blocks": 12},
}


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_mamba(TINY_MAMBA, tmp_path_factory.mktemp("mamba"), seed=5)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_greedy_tokens_and_logprobs_equal_hf(
    runner_name: str, schedule: str, mamba_dir: Path
) -> None:
    hf = load_hf(mamba_dir)
    prompts = prompts_for(VOCAB, [5, 13, 30, 1])
    params = SamplingParams(
        max_tokens=NUM_NEW, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    core = make_engine(runner_name, mamba_dir, max_model_len=128, **SCHEDULES[schedule])
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    if schedule == "preempted":
        assert sum(r.num_preemptions for r in done.values()) > 0, "the set-up must preempt"
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW, do_sample=False)[
                0
            ].tolist()
        assert prompt + req.output_token_ids == want, (
            f"{schedule}/r{i}: greedy tokens differ from HF generate"
        )
        ref = reference_generate(hf, prompt, params.with_seed(0), set(), 10**6)
        got = [lp for chunk in req.logprobs for lp in chunk.sampled_logprobs()]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)
        if len(prompt) > 1:
            got_prompt = torch.tensor(
                [lp for c in req.prompt_logprobs for lp in c.sampled_logprobs()]
            )
            torch.testing.assert_close(got_prompt, prompt_logprobs(hf, prompt), atol=1e-4, rtol=0)


def test_seeded_samples_and_prompt_logprobs_do_not_depend_on_chunking_or_preemption(
    runner_name: str, mamba_dir: Path
) -> None:
    prompts = prompts_for(VOCAB, [9, 30, 17, 25], seed=3)
    params = [
        SamplingParams(
            max_tokens=12,
            temperature=t,
            top_p=0.95,
            seed=100 + i,
            ignore_eos=True,
            prompt_logprobs=2,
        )
        for i, t in enumerate([0.7, 1.0, 1.3, 0.9])
    ]
    alone = {
        i: run(make_engine(runner_name, mamba_dir), {"x": (p, params[i])})["x"]
        for i, p in enumerate(prompts)
    }
    squeezed = make_engine(
        runner_name, mamba_dir, max_num_batched_tokens=8, block_size=4, num_kv_blocks=20
    )
    done = run(squeezed, {f"r{i}": (p, params[i]) for i, p in enumerate(prompts)})
    assert sum(r.num_preemptions for r in done.values()) > 0
    for i in range(len(prompts)):
        got, want = done[f"r{i}"], alone[i]
        assert got.output_token_ids == want.output_token_ids
        np.testing.assert_array_equal(
            np.concatenate([c.token_ids for c in got.prompt_logprobs]),
            np.concatenate([c.token_ids for c in want.prompt_logprobs]),
        )
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in got.prompt_logprobs]),
            np.concatenate([c.logprobs for c in want.prompt_logprobs]),
            rtol=1e-5,
            atol=1e-5,
        )


def _states(core: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    caches = core.runner.kv_caches
    assert caches and all(isinstance(c, MambaState) for c in caches)
    return [(c.conv[0].clone(), c.ssm[0].clone()) for c in caches]


def test_a_reused_state_slot_carries_nothing_over(runner_name: str, mamba_dir: Path) -> None:
    long_prompt, short_prompt = prompts_for(VOCAB, [60, 7], seed=9)
    light = SamplingParams(max_tokens=10, temperature=1.2, seed=5, ignore_eos=True, logprobs=1)
    heavy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    core = make_engine(
        runner_name, mamba_dir, max_num_seqs=1
    )  # one slot: the light request reuses it
    run(core, {"heavy": (long_prompt, heavy)})
    stale = _states(core)
    after = run(core, {"light": (short_prompt, light)})["light"]
    fresh_core = make_engine(runner_name, mamba_dir, max_num_seqs=1)
    fresh = run(fresh_core, {"light": (short_prompt, light)})["light"]
    assert after.output_token_ids == fresh.output_token_ids
    np.testing.assert_array_equal(
        np.concatenate([c.logprobs for c in after.logprobs]),
        np.concatenate([c.logprobs for c in fresh.logprobs]),
    )
    for (conv, ssm), (fresh_conv, fresh_ssm), (stale_conv, _) in zip(
        _states(core), _states(fresh_core), stale, strict=True
    ):
        torch.testing.assert_close(
            conv, fresh_conv, atol=0, rtol=0
        )  # every state field of the slot
        torch.testing.assert_close(ssm, fresh_ssm, atol=0, rtol=0)
        assert not torch.equal(conv, stale_conv)


def test_options_the_state_rules_out_are_refused_by_name(
    runner_name: str, mamba_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for mode in ("align", "all"):
        with pytest.raises(
            EngineConfigError, match=f"mamba_cache_mode='{mode}'.*not implemented.*'none'"
        ):
            make_engine(runner_name, mamba_dir, mamba_cache_mode=mode)
    with pytest.raises(EngineConfigError, match="mamba_cache_mode must be one of none, align, all"):
        make_engine(runner_name, mamba_dir, mamba_cache_mode="some")
    # Prefix caching is turned off, as vLLM does, and said so (a warning when it was asked for).
    with caplog.at_level("INFO", logger="turnout.engine"):
        assert (
            make_engine(
                runner_name, mamba_dir, enable_prefix_caching=True
            ).config.enable_prefix_caching
            is False
        )
        assert make_engine(runner_name, mamba_dir).config.enable_prefix_caching is False
    levels = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if "prefix caching is off" in r.getMessage()
    ]
    assert [lvl for lvl, _ in levels] == ["WARNING", "INFO"]
    assert "enable_prefix_caching=True is not supported for MambaForCausalLM" in levels[0][1]
    with pytest.raises(EngineConfigError, match="recurrent state of max_num_seqs=64 requests"):
        make_engine(runner_name, mamba_dir, kv_cache_memory_gb=1e-6)


@pytest.mark.parametrize("runner", ["auto", "v1", "v2"])
def test_llm_decides_loads_and_generates_mamba(runner: str, mamba_dir: Path) -> None:
    pytest.importorskip("pydantic")  # the oracle
    from turnout.engine.llm import LLM

    llm = LLM(
        mamba_dir, runner, device="cpu", max_model_len=128, kv_cache_memory_gb=0.01, environ={}
    )
    assert (llm.deployment.architecture, llm.decision.family) == ("MambaForCausalLM", "mamba")
    if runner != "auto":
        assert llm.runner_name == runner
    assert type(llm.core.runner).__module__.startswith(f"turnout.runner_{llm.runner_name}.")
    prompt = prompts_for(VOCAB, [11], seed=3)[0]
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    with torch.no_grad():
        want = (
            load_hf(mamba_dir)
            .generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0]
            .tolist()
        )
    assert prompt + out.outputs[0].token_ids == want
