"""Mamba-130m at its real size on CUDA (``gpu`` marker; run by ``scripts/gpu_check.sh``), with
random weights written from policies/reference/model_configs/mamba-130m.json: the Triton
conv1d and selective-scan kernels under both runners.

- float32: greedy tokens of runner_v1, runner_v2 and HF transformers are identical, through
  chunked prefill and under forced preemption;
- bfloat16: runner_v1 and runner_v2 agree token for token, and with HF transformers' bf16
  forward on the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gpu_helpers import free, make_core, prompts_for, run

from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")
CONFIG = Path(__file__).parents[2] / "policies" / "reference" / "model_configs" / "mamba-130m.json"
NUM_NEW = 8


@pytest.fixture(scope="module")
def mamba_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cfg = json.loads(CONFIG.read_text())["config"]
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        path = tmp_path_factory.mktemp(f"mamba-130m-{dtype}".replace("torch.", ""))
        write_random_weights(cfg, path, dtype=dtype, seed=11)
        out[str(dtype).removeprefix("torch.")] = path
    return out


def _hf_greedy(path: Path, dtype: torch.dtype, prompts: list[list[int]]) -> list[list[int]]:
    hf = transformers.MambaForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = hf.generate(
                torch.tensor([p], device="cuda"),
                max_new_tokens=NUM_NEW,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0].tolist()
            out.append(ids[len(p) :])
    del hf
    free()
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_both_runners_equal_hf_at_the_real_size(dtype: str, mamba_dirs: dict[str, Path]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = mamba_dirs[dtype]
    prompts = prompts_for(50280, [7, 64, 200, 333, 1])
    want = _hf_greedy(path, getattr(torch, dtype), prompts)
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0, ignore_eos=True)
    got = {}
    for runner in ("v1", "v2"):
        for name, kwargs in {
            "chunked": {"max_num_batched_tokens": 128},
            "preempted": {"max_num_batched_tokens": 128, "num_kv_blocks": 24},
        }.items():
            core = make_core(runner, path, dtype, max_model_len=512, **kwargs)
            done = run(core, prompts, params)
            if name == "preempted":
                assert sum(r.num_preemptions for r in done) > 0
            got[runner, name] = [r.output_token_ids for r in done]
            del core
            free()
    for key, tokens in got.items():
        assert tokens == want, f"{key} ({dtype}) differs from HF transformers"
