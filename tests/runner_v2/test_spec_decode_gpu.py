"""Speculative decoding on runner_v2 on CUDA (``gpu`` marker; ``scripts/gpu_check.sh`` runs it).

Random weights at Qwen3-0.6B's shapes (all 28 layers, its 151,936-token vocabulary), written in
bf16 from ``policies/reference/model_configs/qwen3-0.6b.json`` and run in float32, where the
target's verification (``1 + k`` tokens per request) and plain decoding (1) agree on every
argmax:

- greedy tokens with speculation are plain decoding's for k = 1, 3, 5: the target as its own
  draft (every draft accepted), a random 2-layer draft of the same vocabulary, and ``ngram_gpu``;
- CUDA-graph replays (the target's ``1 + k`` decode shape, the draft's 1- and 2-token forwards)
  give the eager tokens;
- the step path never synchronises with speculation (CUDA's sync debug mode ``error``), and the
  engine keeps planning one step ahead (asynchronous scheduling);
- a seeded sampled request repeats exactly, and the target as its own draft samples plain
  sampling's tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "parity"))
from gpu_helpers import free, make_core, prompts_for, run

from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams
from turnout.runner_v2.async_output import AsyncOutput

pytestmark = pytest.mark.gpu
CONFIGS = Path(__file__).parents[2] / "policies" / "reference" / "model_configs"
QWEN3 = dict(json.loads((CONFIGS / "qwen3-0.6b.json").read_text())["config"])
# Untied: a random model with tied N(0, 1) embeddings predicts its input token again (the
# embedding dominates the last hidden state), so a tied random draft agreed with the random
# target on every token (acceptance 1.0) and never exercised a rejection.
DRAFT = {
    **QWEN3,
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "tie_word_embeddings": False,
}
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "target": write_random_weights(
            QWEN3, tmp_path_factory.mktemp("qwen3-0.6b"), dtype=torch.bfloat16, seed=11
        ),
        "random": write_random_weights(
            DRAFT, tmp_path_factory.mktemp("qwen3-draft"), dtype=torch.bfloat16, seed=5
        ),
    }


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    base = prompts_for(QWEN3["vocab_size"], [7, 33, 120, 250])
    base[1] = base[1][:11] * 3  # a repetitive prompt: n-gram drafts to find
    return base


@pytest.fixture(scope="module")
def plain(dirs: dict[str, Path], prompts: list[list[int]]) -> list[list[int]]:
    core = make_core("v2", dirs["target"], "float32")
    out = [r.output_token_ids for r in run(core, prompts, GREEDY)]
    del core
    free()
    return out


def _spec(dirs: dict[str, Path], method: str, draft: str | None, k: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if draft is not None:
        spec["model"] = str(dirs[draft])
    return spec


CASES = [("draft_model", d, k) for d in ("target", "random") for k in (1, 3, 5)] + [
    ("ngram_gpu", None, k) for k in (1, 3, 5)
]


@pytest.mark.parametrize(
    ("method", "draft", "k"), CASES, ids=[f"{m}-{d or 'table'}-k{k}" for m, d, k in CASES]
)
def test_greedy_speculation_equals_plain_decoding(
    method: str,
    draft: str | None,
    k: int,
    dirs: dict[str, Path],
    prompts: list[list[int]],
    plain: list[list[int]],
) -> None:
    core = make_core(
        "v2", dirs["target"], "float32", speculative_config=_spec(dirs, method, draft, k)
    )
    got = [r.output_token_ids for r in run(core, prompts, GREEDY)]
    stats, runner = core.spec_decode_stats, core.runner
    assert got == plain
    assert (
        stats.num_draft_tokens > 0 and runner.num_graph_steps > 0
    )  # verifications replayed graphs
    if draft == "target":
        # Its drafts are the target's own argmax, computed in other GEMM shapes (1 and 2 tokens
        # per request instead of 1 + k): all accepted but where rounding splits a near-tie.
        assert stats.acceptance_rate > 0.9
        assert runner.draft is not None and runner.draft.num_graph_forwards > 0
    elif draft == "random":
        assert stats.acceptance_rate < 0.2
    else:
        assert stats.num_accepted_tokens > 0  # the repetitive prompt
    del core
    free()


@pytest.mark.parametrize("method", ["draft_model", "ngram_gpu"])
def test_cuda_graph_replays_equal_eager(
    method: str, dirs: dict[str, Path], prompts: list[list[int]]
) -> None:
    spec = _spec(dirs, method, "random" if method == "draft_model" else None, 3)
    got = {}
    for eager in (False, True):
        core = make_core(
            "v2", dirs["target"], "float32", speculative_config=spec, enforce_eager=eager
        )
        got[eager] = [r.output_token_ids for r in run(core, prompts, GREEDY)]
        runner = core.runner
        assert (runner.num_graph_steps > 0) != eager
        if runner.draft is not None:
            assert (runner.draft.num_graph_forwards > 0) != eager
        del core
        free()
    assert got[False] == got[True]


def test_step_path_never_synchronises_and_stays_asynchronous(dirs: dict[str, Path]) -> None:
    spec = _spec(dirs, "draft_model", "random", 3)
    core = make_core(
        "v2", dirs["target"], "bfloat16", speculative_config=spec, max_num_batched_tokens=64
    )
    assert core.async_scheduling and core.runner.drafts_on_device
    prompts = prompts_for(QWEN3["vocab_size"], [40, 100, 9], seed=3)
    params = [
        SamplingParams(
            max_tokens=10, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1
        ),
        SamplingParams(
            max_tokens=10,
            temperature=0.8,
            top_k=20,
            top_p=0.9,
            seed=1,
            ignore_eos=True,
            repetition_penalty=1.2,
        ),
        SamplingParams(max_tokens=10, temperature=1.0, seed=2, min_tokens=4),
    ]
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(f"r{i}", prompt, p)
    runner = core.runner
    real = runner.execute_model
    handles = []

    def checked(so):
        torch.cuda.set_sync_debug_mode("error")  # any synchronising op raises
        try:
            out = real(so)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        handles.append(out)
        return out

    runner.execute_model = checked  # type: ignore[method-assign]
    done = core.run_until_done()  # the engine's own asynchronous loop
    assert len(done) == 3 and all(len(r.output_token_ids) == 10 for r in done)
    launched = [
        h for h in handles if isinstance(h, AsyncOutput)
    ]  # (the others: bookkeeping-only steps)
    assert len(launched) >= 3 and core.spec_decode_stats.num_drafts > 0
    del core
    free()


def test_seeded_sampling_repeats_and_the_target_as_its_own_draft_samples_plain_tokens(
    dirs: dict[str, Path], prompts: list[list[int]]
) -> None:
    params = [
        SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=100 + i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    outs = {}
    for name, spec in (
        ("plain", None),
        ("self", _spec(dirs, "draft_model", "target", 3)),
        ("random", _spec(dirs, "draft_model", "random", 3)),
        ("random-again", _spec(dirs, "draft_model", "random", 3)),
    ):
        core = make_core("v2", dirs["target"], "float32", speculative_config=spec)
        outs[name] = [r.output_token_ids for r in run(core, prompts, params)]
        del core
        free()
    assert outs["self"] == outs["plain"]
    assert outs["random"] == outs["random-again"]
