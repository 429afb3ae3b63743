"""runner_v1 on CUDA (``gpu`` marker): greedy tokens equal HF transformers ``generate`` on the same
fp32 weights for every tiny architecture, logprobs within 1e-4, through the Triton attention
kernel, chunked prefill, scattered blocks and its decode CUDA graphs (replayed steps equal the
eager ones token for token, seeded samples and logprobs included)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")

NUM_NEW = 10


@pytest.mark.parametrize("arch", sorted(TINY_DECODER_CONFIGS))
def test_greedy_parity_with_hf_on_cuda(arch: str, tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS[arch], tmp_path, dtype=torch.float32, seed=3)
    config = engine_config_for(
        tmp_path,
        device="cuda",
        max_model_len=256,
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=512,
    )
    core = build_engine_core(config, "v1")
    gen = torch.Generator().manual_seed(7)
    prompts = [
        torch.randint(3, config.vocab_size, (n,), generator=gen).tolist() for n in (5, 13, 22, 40)
    ]
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0, ignore_eos=True, logprobs=1)
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, params)
    done = {r.req_id: r for r in core.run_until_done()}
    hf = (
        transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, dtype=torch.float32, attn_implementation="eager"
        )
        .cuda()
        .eval()
    )
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    for i, prompt in enumerate(prompts):
        req = done[f"r{i}"]
        with torch.no_grad():
            ids = torch.tensor([prompt], device="cuda")
            want = hf.generate(ids, max_new_tokens=NUM_NEW, do_sample=False)[0].tolist()
            full = torch.tensor([want[:-1]], device="cuda")
            ref = hf(full).logits[0, len(prompt) - 1 :].float().log_softmax(-1)
        assert prompt + req.output_token_ids == want, f"{arch}/r{i}"
        got = torch.tensor([lp for c in req.logprobs for lp in c.sampled_logprobs()])
        want_lp = ref.gather(1, torch.tensor(want[len(prompt) :], device="cuda")[:, None])[
            :, 0
        ].cpu()
        torch.testing.assert_close(got, want_lp, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_graphs_replay_the_eager_steps(dtype: str, tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS["qwen3"], tmp_path, dtype=torch.float32, seed=5)
    gen = torch.Generator().manual_seed(9)
    vocab_size = TINY_DECODER_CONFIGS["qwen3"]["vocab_size"]
    prompts = [
        torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in (3, 9, 17, 30, 41)
    ]
    params = [
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=12, temperature=0.8, seed=11, ignore_eos=True, logprobs=2),
    ]
    runs = {}
    for eager in (False, True):
        config = engine_config_for(
            tmp_path,
            device="cuda",
            dtype=dtype,
            max_model_len=128,
            max_num_seqs=8,
            block_size=4,
            num_kv_blocks=256,
            enforce_eager=eager,
        )
        core = build_engine_core(config, "v1")
        for i, prompt in enumerate(prompts):
            core.add_request(f"r{i}", prompt, params[i % 2])
        runs[eager] = {r.req_id: r for r in core.run_until_done()}
        if eager:
            assert core.runner.decode_graphs is None and core.runner.num_graph_steps == 0
        else:  # every step after the prompts is a decode step of 5 requests, padded to 8
            assert core.runner.decode_graphs.num_captured == 4 and core.runner.num_graph_steps >= 11
        del core
        torch.cuda.empty_cache()
    for req_id, req in runs[False].items():
        want = runs[True][req_id]
        assert req.output_token_ids == want.output_token_ids, req_id
        got_lp = [lp for c in req.logprobs for lp in c.sampled_logprobs()]
        want_lp = [lp for c in want.logprobs for lp in c.sampled_logprobs()]
        assert got_lp == pytest.approx(want_lp, abs=1e-5 if dtype == "float32" else 2e-2), req_id
