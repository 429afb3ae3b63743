"""DeepseekV2ForCausalLM on both runners (CPU, fp32), on weights HF transformers wrote from
configs shrunk from DeepSeek-V2-Lite (plain q_proj, and DeepSeek-V2's LoRA'd q path): greedy
tokens equal HF ``generate`` and logprobs/prompt logprobs equal HF's within 1e-4 through
chunked prefill; the latent cache keeps prefix caching, chunked prefill and preemption exact;
``LLM(dir)`` decides a runner and generates."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_engine, prompts_for, run
from reference import load_hf, reference_generate

from turnout.engine.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from deepseek_tiny import TINY_DEEPSEEK_V2, write_hf_random_weights

pytest.importorskip("transformers")
VOCAB = TINY_DEEPSEEK_V2["lite"]["vocab_size"]


@pytest.fixture(scope="module")
def deepseek_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: write_hf_random_weights(cfg, tmp_path_factory.mktemp(f"deepseek-{name}"), seed=9)
        for name, cfg in TINY_DEEPSEEK_V2.items()
    }


PROMPT_LENS = [5, 13, 30]
NUM_NEW = 6


@pytest.fixture(scope="module")
def hf_greedy(deepseek_dirs: dict) -> dict[str, list[tuple[list[int], torch.Tensor]]]:
    """Per variant and prompt: HF ``generate``'s greedy sequence and the logprobs of its every
    token after the first (one teacher-forced forward), computed once for both runners."""
    out = {}
    for variant, path in deepseek_dirs.items():
        hf = load_hf(path)
        refs = []
        for prompt in prompts_for(VOCAB, PROMPT_LENS):
            with torch.no_grad():
                seq = hf.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW, do_sample=False)[
                    0
                ]
                lps = hf(seq[None]).logits[0, :-1].float().log_softmax(-1)
            refs.append((seq.tolist(), lps.gather(1, seq[1:, None])[:, 0]))
        out[variant] = refs
    return out


@pytest.mark.parametrize("variant", sorted(TINY_DEEPSEEK_V2))
def test_greedy_tokens_and_logprobs_equal_hf(
    runner_name: str, variant: str, deepseek_dirs: dict, hf_greedy: dict
) -> None:
    prompts = prompts_for(VOCAB, PROMPT_LENS)
    params = SamplingParams(
        max_tokens=NUM_NEW, temperature=0, ignore_eos=True, logprobs=1, prompt_logprobs=1
    )
    # A small token budget and block size: chunked prefill mixed with decodes, scattered blocks.
    core = make_engine(runner_name, deepseek_dirs[variant], max_num_batched_tokens=12, block_size=4)
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        req, (want, want_lps) = done[f"r{i}"], hf_greedy[variant][i]
        assert prompt + req.output_token_ids == want, (
            f"{variant}/r{i}: greedy tokens differ from HF generate"
        )
        got_lps = [lp for chunk in req.logprobs for lp in chunk.sampled_logprobs()]
        torch.testing.assert_close(
            torch.tensor(got_lps), want_lps[len(prompt) - 1 :], atol=1e-4, rtol=0
        )
        got_prompt = torch.tensor([lp for c in req.prompt_logprobs for lp in c.sampled_logprobs()])
        torch.testing.assert_close(got_prompt, want_lps[: len(prompt) - 1], atol=1e-4, rtol=0)


def test_latent_cache_sizes_the_block_pool(runner_name: str, deepseek_dirs: dict) -> None:
    core = make_engine(runner_name, deepseek_dirs["lite"], block_size=4, kv_cache_memory_gb=1e-3)
    # 3 layers x 4 slots x (kv_lora_rank 32 + qk_rope_head_dim 8) x 4 bytes = 1920 bytes a block
    assert core.runner.kv_cache_block_bytes() == 1920
    assert core.scheduler.kv_cache_manager.num_blocks == int(1e-3 * 2**30) // 1920
    assert all(
        t.shape == (core.scheduler.kv_cache_manager.num_blocks, 4, 40)
        for t in core.runner.kv_caches
    )


def test_prefix_cache_hits_do_not_change_outputs(runner_name: str, deepseek_dirs: dict) -> None:
    path = deepseek_dirs["q-lora"]
    system = prompts_for(VOCAB, [21], seed=12)[0]
    tails = prompts_for(VOCAB, [1, 6, 11], seed=13)
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True, logprobs=1)
    requests = {f"r{i}": ([*system, *tail], params) for i, tail in enumerate(tails)}
    cached = make_engine(runner_name, path, block_size=4)
    first = run(cached, {"r0": requests["r0"]})  # fills the cache with the shared prefix
    done = {**first, **run(cached, {k: v for k, v in requests.items() if k != "r0"})}
    uncached = run(
        make_engine(runner_name, path, block_size=4, enable_prefix_caching=False), requests
    )
    assert [done[k].num_cached_tokens for k in sorted(done)] == [0, 20, 20]
    for k, req in done.items():
        assert req.output_token_ids == uncached[k].output_token_ids
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in req.logprobs]),
            np.concatenate([c.logprobs for c in uncached[k].logprobs]),
            rtol=1e-5,
            atol=1e-5,
        )


def test_chunking_and_preemption_do_not_change_outputs(
    runner_name: str, deepseek_dirs: dict
) -> None:
    path = deepseek_dirs["lite"]
    prompts = prompts_for(VOCAB, [22, 13, 17], seed=3)
    params = [
        SamplingParams(max_tokens=10, temperature=t, seed=100 + i, ignore_eos=True, logprobs=0)
        for i, t in enumerate([0.0, 1.0, 0.7])
    ]
    requests = {f"r{i}": (p, params[i]) for i, p in enumerate(prompts)}
    plain = run(make_engine(runner_name, path), requests)
    squeezed = make_engine(
        runner_name, path, max_num_batched_tokens=8, block_size=4, num_kv_blocks=12
    )
    done = run(squeezed, requests)
    assert sum(r.num_preemptions for r in done.values()) > 0
    for k, req in done.items():
        assert req.output_token_ids == plain[k].output_token_ids
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in req.logprobs]),
            np.concatenate([c.logprobs for c in plain[k].logprobs]),
            rtol=1e-5,
            atol=1e-5,
        )


def test_llm_decides_a_runner_and_generates(deepseek_dirs: dict) -> None:
    from turnout.engine.llm import LLM

    path = deepseek_dirs["lite"]
    prompt = prompts_for(VOCAB, [9], seed=4)[0]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    want = reference_generate(load_hf(path), prompt, greedy.with_seed(0), set(), 10**6).token_ids
    outputs = {}
    for runner in ("auto", "v1", "v2"):
        llm = LLM(path, runner=runner, max_model_len=256, kv_cache_memory_gb=0.01)
        assert llm.decision.family == "deepseek_v2"
        outputs[runner] = (llm.runner_name, llm.generate([prompt], greedy)[0].outputs[0].token_ids)
    assert outputs["auto"][0] == "v1"  # the qwen-deepseek-moe stage's canary is off by default
    assert {k: v[0] for k, v in outputs.items()} == {"auto": "v1", "v1": "v1", "v2": "v2"}
    assert all(list(tokens) == want for _, tokens in outputs.values())
