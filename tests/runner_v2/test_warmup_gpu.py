"""After runner_v2's start-up warm-up no step compiles a Triton kernel: requests of random
lengths arrive in waves (batch sizes from 1 up, chunked prefills beside decodes), with and
without penalties, logprobs of several k, top-k/top-p and min_tokens, and the compiled variants
of every kernel of ``kernels/`` are the same before and after (a compilation mid-serving is
what made the first request at each new batch size wait 0.2-0.7 s per kernel)."""

from __future__ import annotations

import random
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


def compiled_variants() -> dict[str, int]:
    """Compiled variants per Triton kernel of ``kernels/`` in this process."""
    from triton.runtime.jit import JITFunction

    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("turnout.kernels."):
            continue
        for attr in vars(module).values():
            if isinstance(attr, JITFunction):
                caches = getattr(attr, "device_caches", {})
                out[f"{name}.{attr.fn.__name__}"] = sum(len(c[0]) for c in caches.values())
    return out


def _params(rng: random.Random) -> SamplingParams:
    kind = rng.randrange(5)
    return SamplingParams(
        max_tokens=rng.randint(2 if kind == 4 else 1, 12),
        ignore_eos=True,
        seed=rng.randrange(1 << 30),
        temperature=0.0 if kind == 0 else 0.8,
        repetition_penalty=1.2 if kind == 1 else 1.0,
        presence_penalty=0.5 if kind == 1 else 0.0,
        logprobs=rng.randint(0, 3) if kind == 2 else None,
        top_k=5 if kind == 3 else 0,
        top_p=0.9 if kind == 3 else 1.0,
        min_tokens=2 if kind == 4 else 0,
    )


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_no_kernel_compiles_after_the_warm_up(dtype: str, tmp_path: Path) -> None:
    write_random_weights(TINY_DECODER_CONFIGS["qwen3"], tmp_path, dtype=torch.float32, seed=7)
    config = engine_config_for(
        tmp_path,
        device="cuda",
        dtype=dtype,
        max_model_len=128,
        max_num_seqs=24,
        max_num_batched_tokens=96,
        block_size=4,
        num_kv_blocks=512,
    )
    core = build_engine_core(config, "v2")
    before = compiled_variants()
    assert core.runner.num_warm_up_steps > 0
    # The kernels launched around the graphs hold variants already (the capture compiles none of them)
    around = [
        "post_update._post_update_kernel",
        "gumbel_sample._gumbel_sample_kernel",
        "query_start_loc._prepare_query_start_loc_kernel",
        "staged_writes._apply_staged_writes_kernel",
    ]
    assert all(before.get(f"turnout.kernels.{k}", 0) > 0 for k in around), before
    rng = random.Random(0)
    vocab = TINY_DECODER_CONFIGS["qwen3"]["vocab_size"]
    num_done, num_reqs = 0, 0
    for wave in range(12):  # 1, 2, ... new requests per wave, beside those still decoding
        for _ in range(wave + 1):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 60))]
            core.add_request(f"w{wave}r{num_reqs}", prompt, _params(rng))
            num_reqs += 1
        for _ in range(rng.randint(1, 6)):
            num_done += len(core.step())
    num_done += len(core.run_until_done())
    assert num_done == num_reqs
    assert core.runner.num_eager_steps == 0, f"{core.runner.num_eager_steps} eager steps"
    after = compiled_variants()
    grew = {k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}
    assert not grew, f"compiled while serving (before, after): {grew}"
