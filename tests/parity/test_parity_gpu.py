"""Both runners on CUDA (``gpu`` marker; run by ``scripts/gpu_check.sh`` on the H200).

Real shapes with random weights written in bf16 from ``policies/reference/model_configs/``:
Qwen3-0.6B (all 28 layers) and Llama-3.1-8B (every dimension of the real config — hidden 4096,
32/8 heads, head_dim 128, vocabulary 128256, llama3 RoPE — with 4 of its 32 layers, to keep the
GPU time of the check small):

- in float32, greedy tokens of runner_v1, runner_v2 (CUDA graphs on and off) and HF
  transformers are identical;
- in bfloat16, runner_v1 and runner_v2 agree token for token run eagerly (the same GEMM shapes),
  and runner_v2 with CUDA graphs replays its decode steps;
- seeded sampling (temperature, top-k, top-p, penalties) gives the same tokens on both runners;
- runner_v2's step path never synchronises (CUDA sync debug mode ``error``), and its decode
  padding slots are ``-1``;
- tiny configurations of every architecture: runner_v2 greedy equals HF (runner_v1's own test
  is ``tests/runner_v1/test_v1_gpu.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from gpu_helpers import free, make_core, prompts_for, run
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")
CONFIGS = Path(__file__).parents[2] / "policies" / "reference" / "model_configs"
SHAPES = {"qwen3-0.6b": None, "llama-3.1-8b": 4}  # config file -> layers kept (None: all)


def real_config(name: str) -> dict[str, Any]:
    cfg = dict(json.loads((CONFIGS / f"{name}.json").read_text())["config"])
    if SHAPES[name] is not None:
        cfg["num_hidden_layers"] = SHAPES[name]
    return cfg


@pytest.fixture(scope="module")
def shape_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in SHAPES:
        path = tmp_path_factory.mktemp(name)
        write_random_weights(real_config(name), path, dtype=torch.bfloat16, seed=11)
        out[name] = path
    return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fp32_greedy_equal_hf_on_both_runners(shape: str, shape_dirs: dict[str, Path]) -> None:
    path, cfg = shape_dirs[shape], real_config(shape)
    prompts = prompts_for(cfg["vocab_size"], [7, 33, 120, 250])
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    got = {}
    for name, runner, extra in (
        ("v1", "v1", {}),
        ("v2", "v2", {}),
        ("v2-eager", "v2", {"enforce_eager": True}),
    ):
        core = make_core(runner, path, "float32", **extra)
        got[name] = run(core, prompts, params)
        if name == "v2":
            assert core.runner.num_graph_steps > 0  # decodes replayed graphs
        del core
        free()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    hf.generation_config.eos_token_id = None
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt], device="cuda"),
                max_new_tokens=12,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        for name, reqs in got.items():
            assert reqs[i].output_token_ids == want, f"{shape}/{name}/r{i}"
    # float32 rounding of GEMMs run at other row counts (V2 replays prefill chunks from graphs
    # of padded token counts): logprobs near -100 of the unlikely top-k differ by ~16 ulps.
    for i in range(len(prompts)):
        lp = {n: np.concatenate([c.logprobs for c in reqs[i].logprobs]) for n, reqs in got.items()}
        np.testing.assert_allclose(lp["v2"], lp["v1"], atol=1e-4, rtol=1e-5)
        np.testing.assert_allclose(lp["v2-eager"], lp["v1"], atol=1e-4, rtol=1e-5)
    del hf
    free()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_bf16_runners_agree(shape: str, shape_dirs: dict[str, Path]) -> None:
    path, cfg = shape_dirs[shape], real_config(shape)
    prompts = prompts_for(cfg["vocab_size"], [5, 64, 200, 17, 90], seed=1)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, prompt_logprobs=1)
    eager = {"enforce_eager": True}
    v1 = run(make_core("v1", path, "bfloat16"), prompts, params)
    free()
    v2 = run(make_core("v2", path, "bfloat16", **eager), prompts, params)
    free()
    for a, b in zip(v1, v2, strict=True):
        assert a.output_token_ids == b.output_token_ids
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in b.prompt_logprobs]),
            np.concatenate([c.logprobs for c in a.prompt_logprobs]),
            atol=1e-3,
        )
    core = make_core("v2", path, "bfloat16")
    graphs = run(core, prompts, params)
    assert core.runner.num_graph_steps >= 10
    # Prefill runs eagerly in both: the first token is the same; decodes replay graphs whose
    # padded GEMMs may round differently in bf16.
    assert [r.output_token_ids[0] for r in graphs] == [r.output_token_ids[0] for r in v1]
    assert all(len(r.output_token_ids) == 16 for r in graphs)


def test_seeded_sampling_equal_across_runners(shape_dirs: dict[str, Path]) -> None:
    path, cfg = shape_dirs["qwen3-0.6b"], real_config("qwen3-0.6b")
    prompts = prompts_for(cfg["vocab_size"], [11, 40, 75, 3, 150, 60, 25], seed=2)
    params = [
        SamplingParams(max_tokens=20, temperature=0.9, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=1.2, top_k=40, seed=8, ignore_eos=True),
        SamplingParams(
            max_tokens=20, temperature=0.7, top_p=0.9, seed=9, ignore_eos=True, logprobs=3
        ),
        SamplingParams(
            max_tokens=20, temperature=1.0, top_k=100, top_p=0.8, seed=10, ignore_eos=True
        ),
        SamplingParams(
            max_tokens=20,
            temperature=0.8,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            presence_penalty=0.4,
            seed=11,
            ignore_eos=True,
        ),
        SamplingParams(max_tokens=20, temperature=1.0, min_tokens=10, seed=12),
        SamplingParams(
            max_tokens=20, temperature=1.3, min_p=0.05, top_k=200, seed=13, ignore_eos=True
        ),
    ]
    v1 = run(make_core("v1", path, "float32"), prompts, params)
    free()
    v2 = run(make_core("v2", path, "float32"), prompts, params)
    for a, b in zip(v1, v2, strict=True):
        assert a.output_token_ids == b.output_token_ids


def test_v2_step_path_never_synchronises(shape_dirs: dict[str, Path]) -> None:
    path, cfg = shape_dirs["qwen3-0.6b"], real_config("qwen3-0.6b")
    core = make_core("v2", path, "bfloat16", max_num_batched_tokens=64, block_size=16)
    prompts = prompts_for(cfg["vocab_size"], [40, 100, 9], seed=3)
    params = [
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1),
        SamplingParams(
            max_tokens=8,
            temperature=0.8,
            top_k=20,
            top_p=0.9,
            seed=1,
            ignore_eos=True,
            repetition_penalty=1.2,
        ),
        SamplingParams(max_tokens=8, temperature=1.0, seed=2, min_tokens=4),
    ]
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(f"r{i}", prompt, p)
    scheduler, runner = core.scheduler, core.runner
    num_steps = 0
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising op raises
        try:
            handle = runner.execute_model(so)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        output = handle.get_output() if hasattr(handle, "get_output") else handle
        scheduler.update_from_output(so, output)
        num_steps += 1
    assert num_steps > 8 and runner.num_graph_steps > 0


def test_v2_decode_padding_slots_are_minus_one(shape_dirs: dict[str, Path]) -> None:
    path, cfg = shape_dirs["qwen3-0.6b"], real_config("qwen3-0.6b")
    core = make_core("v2", path, "bfloat16")
    prompts = prompts_for(cfg["vocab_size"], [10, 20, 30], seed=4)
    for i, prompt in enumerate(prompts):
        core.add_request(
            f"r{i}", prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        )
    core.step()  # prefill of 60 tokens: replayed from the mixed graph of 64 tokens
    core.step()  # first decode of 3 requests: replayed at the captured size 4
    torch.cuda.synchronize()
    buffers = core.runner.buffers
    assert core.runner.num_graph_steps == 2 and core.runner.num_mixed_graph_steps == 1
    assert buffers.slot_mapping[3].item() == -1 and buffers.seq_lens[3].item() == 0
    assert (buffers.slot_mapping[:3] >= 0).all()
    assert buffers.query_start_loc[:5].tolist() == [0, 1, 2, 3, 3]
    core.run_until_done()


@pytest.mark.parametrize("arch", sorted(TINY_DECODER_CONFIGS))
def test_tiny_configs_v2_equal_hf(arch: str, tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS[arch], tmp_path, dtype=torch.float32, seed=3)
    core = make_core(
        "v2", tmp_path, "float32", max_model_len=256, max_num_batched_tokens=16, block_size=4
    )
    prompts = prompts_for(TINY_DECODER_CONFIGS[arch]["vocab_size"], [5, 13, 22, 40], seed=7)
    reqs = run(core, prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    hf = (
        transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, dtype=torch.float32, attn_implementation="eager"
        )
        .cuda()
        .eval()
    )
    hf.generation_config.eos_token_id = None
    for prompt, req in zip(prompts, reqs, strict=True):
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt], device="cuda"),
                max_new_tokens=10,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert req.output_token_ids == want, arch


def test_llm_auto_choice_builds_v2_on_cuda(shape_dirs: dict[str, Path]) -> None:
    pytest.importorskip("pydantic")  # the oracle (carried as wheels to the GPU machine)
    from turnout.engine.llm import LLM

    llm = LLM(
        shape_dirs["qwen3-0.6b"],
        device="cuda",
        dtype="bfloat16",
        max_model_len=256,
        kv_cache_memory_gb=2.0,
        environ={},
    )
    assert llm.runner_name == "v2" and llm.decision.mode == "auto"  # the Qwen3 canary stage
    assert type(llm.core.runner).__module__ == "turnout.runner_v2.runner"
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
