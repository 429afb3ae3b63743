"""The real SmolLM2-135M-Instruct weights (the shipped Q4_1 GGUF) give the same answer on both
runners: the chat answer greedily, logprobs of the answer, and a seeded sample (runner_v2's
kernels through the Triton interpreter on CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from turnout.engine.model.tokenizer import load_tokenizer
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def answers(smollm2_gguf: Path) -> dict[str, dict]:
    path = smollm2_gguf
    tok = load_tokenizer(path)
    prompt = tok.encode(tok.apply_chat_template(QUESTION), add_special_tokens=False)
    greedy = SamplingParams(max_tokens=16, temperature=0, logprobs=3)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=1234)
    out = {}
    for runner in ("v1", "v2"):
        core = build_engine_core(
            engine_config_for(path, max_model_len=256, kv_cache_memory_gb=0.05), runner
        )
        core.add_request("greedy", prompt, greedy)
        core.add_request("seeded", prompt, seeded)
        out[runner] = {r.req_id: r for r in core.run_until_done()}
    out["tokenizer"] = tok
    return out


def test_same_greedy_answer_on_both_runners(answers: dict) -> None:
    v1, v2, tok = answers["v1"]["greedy"], answers["v2"]["greedy"], answers["tokenizer"]
    assert v2.output_token_ids == v1.output_token_ids
    assert "Paris" in tok.decode(v2.output_token_ids)
    lp1 = np.concatenate([c.logprobs for c in v1.logprobs])
    lp2 = np.concatenate([c.logprobs for c in v2.logprobs])
    assert np.array_equal(
        np.concatenate([c.token_ids for c in v1.logprobs]),
        np.concatenate([c.token_ids for c in v2.logprobs]),
    )
    np.testing.assert_allclose(lp2, lp1, atol=1e-4)


def test_same_seeded_sample_on_both_runners(answers: dict) -> None:
    assert answers["v2"]["seeded"].output_token_ids == answers["v1"]["seeded"].output_token_ids
