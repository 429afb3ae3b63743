"""Every runner against HF transformers on the same weights (fp32): greedy tokens equal HF
``generate``, logprobs and prompt logprobs within 1e-4, and every sampling option equal to the
independent reference of docs/sampling.md (tests/parity/reference.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_DECODER_CONFIGS, make_engine, prompts_for, run
from reference import load_hf, prompt_logprobs, reference_generate

from turnout.engine.sampling_params import SamplingParams

pytest.importorskip("transformers")

NUM_NEW = 8


@pytest.mark.parametrize("arch", sorted(TINY_DECODER_CONFIGS))
def test_greedy_tokens_and_logprobs_equal_hf(runner_name: str, arch: str, model_dirs: dict) -> None:
    path = model_dirs[arch]
    hf = load_hf(path)
    vocab = TINY_DECODER_CONFIGS[arch]["vocab_size"]
    prompts = prompts_for(vocab, [5, 13, 22, 40])
    params = SamplingParams(
        max_tokens=NUM_NEW, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    # A small token budget and block size: chunked prefill mixed with decodes, scattered blocks.
    core = make_engine(runner_name, path, max_num_batched_tokens=16, block_size=4)
    done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW, do_sample=False)[
                0
            ].tolist()
        assert prompt + req.output_token_ids == want, (
            f"{arch}/r{i}: greedy tokens differ from HF generate"
        )
        ref = reference_generate(hf, prompt, params.with_seed(0), set(), 10**6)
        got_lps = [lp for chunk in req.logprobs for lp in chunk.sampled_logprobs()]
        torch.testing.assert_close(
            torch.tensor(got_lps), torch.tensor(ref.logprobs), atol=1e-4, rtol=0
        )
        got_prompt = torch.tensor([lp for c in req.prompt_logprobs for lp in c.sampled_logprobs()])
        torch.testing.assert_close(got_prompt, prompt_logprobs(hf, prompt), atol=1e-4, rtol=0)


def _force(token: int):
    def force(out_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(logits, float("-inf"))
        forced[token] = 0.0
        return forced if len(out_ids) % 2 == 0 else logits

    return force


def _ban_prompt_tokens(
    prompt_ids: list[int], out_ids: list[int], logits: torch.Tensor
) -> torch.Tensor:
    logits[list(set(prompt_ids))] = float("-inf")
    return logits


OPTIONS = {
    "seeded": SamplingParams(max_tokens=12, temperature=1.0, seed=1234),
    "seeded-hot": SamplingParams(max_tokens=12, temperature=1.7, seed=7),
    "top-k": SamplingParams(max_tokens=12, temperature=0.9, top_k=5, seed=3),
    "top-p": SamplingParams(max_tokens=12, temperature=1.2, top_p=0.6, seed=4),
    "top-k-top-p": SamplingParams(max_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=5),
    "repetition": SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.8),
    "presence-frequency": SamplingParams(
        max_tokens=12, temperature=0.7, presence_penalty=1.5, frequency_penalty=0.8, seed=9
    ),
    "min-tokens": SamplingParams(max_tokens=12, min_tokens=6, temperature=0.0),
    "logits-processors": SamplingParams(
        max_tokens=12, temperature=0.5, seed=2, logits_processors=[_force(42), _ban_prompt_tokens]
    ),
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_sampling_options_equal_the_reference(
    runner_name: str, option: str, model_dirs: dict
) -> None:
    # Untied embeddings: random tied models put nearly all mass on one token, so sampling
    # options would change nothing visible.
    path = model_dirs["llama"]
    hf = load_hf(path)
    prompts = prompts_for(TINY_DECODER_CONFIGS["llama"]["vocab_size"], [6, 19, 30], seed=11)
    params = OPTIONS[option]
    if option == "min-tokens":  # make EOS the greedy first token: min_tokens must hold it back
        eos = {
            reference_generate(
                hf, prompts[0], SamplingParams(max_tokens=1, temperature=0).with_seed(0), set(), 999
            ).token_ids[0]
        }
    else:
        eos = {2}
    core = make_engine(
        runner_name, path, max_num_batched_tokens=24, block_size=4, eos_token_ids=tuple(eos)
    )
    try:
        done = run(core, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    except Exception as exc:  # a runner may refuse an option, clearly
        assert "logits_processors" in str(exc) and option == "logits-processors", exc
        return
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        ref = reference_generate(hf, prompt, req.sampling_params, eos, 256)
        assert req.output_token_ids == ref.token_ids, f"{option}/r{i}"
        assert req.status.finish_reason == ref.finish_reason
    if option == "min-tokens":
        assert len(done["r0"].output_token_ids) >= 6
