"""DeepseekV2ForCausalLM on both runners on CUDA (``gpu`` marker): the Triton latent attention
and fused MoE kernels, runner_v2's CUDA graphs over the latent cache.

- Tiny configs (plain q_proj, LoRA'd q), checkpoints written by transformers, fp32: greedy
  tokens of runner_v1, runner_v2 (CUDA graphs on and off) equal HF ``generate``; logprobs of
  the three agree within 1e-4.
- DeepSeek-V2-Lite's real widths with 2 of its 27 layers (the dense first layer and one MoE
  layer: 64 experts, top-6, 2 shared), bf16, random weights from ``write_random_weights``: the
  KV pool is sized from the 576-value latent rows; runner_v1 and runner_v2 (eager) agree token
  for token; runner_v2 replays its decodes from CUDA graphs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from deepseek_tiny import TINY_DEEPSEEK_V2, deepseek_v2_lite, write_hf_random_weights
from gpu_helpers import free, prompts_for, run
from gpu_helpers import make_core as gpu_make_core

from turnout.engine.core import EngineCore
from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


def make_core(runner: str, path: Path, dtype: str, **kwargs: Any) -> EngineCore:
    kwargs.setdefault("kv_cache_memory_gb", 2.0)
    return gpu_make_core(runner, path, dtype, **kwargs)


@pytest.mark.parametrize("variant", sorted(TINY_DEEPSEEK_V2))
def test_tiny_fp32_greedy_equal_hf_on_both_runners(variant: str, tmp_path: Path) -> None:
    path = write_hf_random_weights(TINY_DEEPSEEK_V2[variant], tmp_path, seed=9)
    prompts = prompts_for(TINY_DEEPSEEK_V2[variant]["vocab_size"], [5, 13, 22, 40], seed=7)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=1)
    got = {}
    for name, runner, extra in (
        ("v1", "v1", {}),
        ("v2", "v2", {}),
        ("v2-eager", "v2", {"enforce_eager": True}),
    ):
        core = make_core(runner, path, "float32", max_num_batched_tokens=16, block_size=4, **extra)
        got[name] = run(core, prompts, params)
        if name == "v2":
            assert core.runner.num_graph_steps > 0  # decodes replayed graphs
        del core
        free()
    hf = (
        transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager"
        )
        .cuda()
        .eval()
    )
    hf.generation_config.eos_token_id = None
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([prompt], device="cuda"),
                max_new_tokens=10,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        for name, reqs in got.items():
            assert reqs[i].output_token_ids == want, f"{variant}/{name}/r{i}"
        lp = {n: np.concatenate([c.logprobs for c in reqs[i].logprobs]) for n, reqs in got.items()}
        np.testing.assert_allclose(lp["v2"], lp["v1"], atol=1e-4)
        np.testing.assert_allclose(lp["v2-eager"], lp["v1"], atol=1e-4)


@pytest.fixture(scope="module")
def lite_two_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = {**deepseek_v2_lite(), "num_hidden_layers": 2}  # layer 0 dense, layer 1 MoE
    return write_random_weights(
        cfg, tmp_path_factory.mktemp("deepseek-v2-lite-2"), dtype=torch.bfloat16, seed=11
    )


def test_bf16_runners_agree_at_real_width(lite_two_layers: Path) -> None:
    path = lite_two_layers
    prompts = prompts_for(102400, [5, 64, 200, 17, 90], seed=1)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, prompt_logprobs=1)
    v1_core = make_core("v1", path, "bfloat16")
    # 2 layers x 16 slots x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes
    assert v1_core.runner.kv_cache_block_bytes() == 2 * 16 * 576 * 2
    assert v1_core.runner.kv_caches[0].shape[1:] == (16, 576)
    v1 = run(v1_core, prompts, params)
    del v1_core
    free()
    v2 = run(make_core("v2", path, "bfloat16", enforce_eager=True), prompts, params)
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
