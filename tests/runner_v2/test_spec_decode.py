"""Speculative decoding on runner_v2 (CPU, kernels interpreted): ``ngram_gpu`` and
``draft_model`` with asynchronous scheduling.

- Greedy outputs with speculation are plain greedy decoding's, token for token, on the shipped
  SmolLM2-135M-Instruct for k = 1, 3, 5: with the target as its own draft (every draft
  accepted), with a random draft of the same vocabulary written by transformers (few accepted),
  and with n-gram drafts matched on the device.
- Sampled outputs are distributed as plain sampling (chi-square against the target's own
  distribution, on a tiny random model); a seeded request repeats exactly; the target as its own
  draft gives plain sampling's very tokens (its drafts are the target's draws).
- Through chunked prefill, preemption, prefix-cache hits, penalties, min_tokens and logprobs;
  a reused row carries nothing of its last request; the step stays asynchronous.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
sys.path.insert(0, str(Path(__file__).parents[1] / "kernels"))
from hf_moe import write_hf_random_weights
from test_rejection_sample import chi_square_p_value
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.core import EngineCore
from turnout.engine.errors import EngineConfigError
from turnout.engine.model import write_random_weights
from turnout.engine.model_info import engine_config_for
from turnout.engine.outputs import Logprobs
from turnout.engine.request import Request
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams
from turnout.runner_v2.async_output import AsyncOutput
from turnout.runner_v2.states import Col

SMOL_VOCAB = 49152


def make(path: Path, spec: dict[str, Any] | None, **kwargs: Any) -> EngineCore:
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("kv_cache_memory_gb", 0.05)
    return build_engine_core(engine_config_for(path, speculative_config=spec, **kwargs), "v2")


def run(
    core: EngineCore, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
) -> list[Request]:
    params = params if isinstance(params, list) else [params] * len(prompts)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(f"r{i}", prompt, p)
    done = {r.req_id: r for r in core.run_until_done()}
    return [done[f"r{i}"] for i in range(len(prompts))]


# ---- SmolLM2 ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol_prompts(smollm2_gguf: Path) -> list[list[int]]:
    from turnout.engine.model.tokenizer import load_tokenizer

    tok = load_tokenizer(smollm2_gguf)
    question = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    return [
        tok.encode(question, add_special_tokens=False),
        tok.encode(
            "one two three four one two three four one two three four one two",
            add_special_tokens=False,
        ),
    ]


GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def smol_plain(smollm2_gguf: Path, smol_prompts: list[list[int]]) -> list[list[int]]:
    return [r.output_token_ids for r in run(make(smollm2_gguf, None), smol_prompts, GREEDY)]


@pytest.fixture(scope="module")
def random_smol_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama of SmolLM2's vocabulary with transformers' own random initialisation."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": SMOL_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    return write_hf_random_weights(cfg, tmp_path_factory.mktemp("random-smol-draft"), seed=1)


CASES = (
    [("draft_model", "self", k) for k in (1, 3, 5)]
    + [("draft_model", "random", k) for k in (1, 3, 5)]
    + [("ngram_gpu", None, k) for k in (1, 3, 5)]
)


@pytest.mark.parametrize(
    ("method", "draft", "k"), CASES, ids=[f"{m}-{d or 'table'}-k{k}" for m, d, k in CASES]
)
def test_greedy_speculation_equals_plain_decoding(
    method: str,
    draft: str | None,
    k: int,
    smollm2_gguf: Path,
    smol_prompts: list[list[int]],
    smol_plain: list[list[int]],
    random_smol_draft: Path,
) -> None:
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if draft is not None:
        spec["model"] = str(smollm2_gguf if draft == "self" else random_smol_draft)
    core = make(smollm2_gguf, spec)
    assert core.async_scheduling and core.runner.drafts_on_device
    done = run(core, smol_prompts, GREEDY)
    assert [r.output_token_ids for r in done] == smol_plain
    stats = core.spec_decode_stats
    assert stats.num_draft_tokens > 0
    if draft == "self":  # the draft is the target: its greedy drafts are the target's argmax
        assert stats.num_accepted_tokens == stats.num_draft_tokens
        assert stats.mean_acceptance_length > 1 + 0.5 * k
    elif draft == "random":
        assert stats.acceptance_rate < 0.2
    else:  # the repetitive prompt's n-grams
        assert stats.num_accepted_tokens > 0
    per_request = [r.spec_decode.num_draft_tokens for r in done]
    assert sum(per_request) == stats.num_draft_tokens  # nothing was discarded at a stop here


# ---- tiny models -----------------------------------------------------------------------------
TINY = {**TINY_DECODER_CONFIGS["llama"], "vocab_size": 24}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Llama (the target) and an unrelated 1-layer draft of its vocabulary."""
    target = write_random_weights(
        TINY, tmp_path_factory.mktemp("tiny-target"), dtype=torch.float32, seed=3
    )
    draft = write_random_weights(
        {**TINY, "num_hidden_layers": 1},
        tmp_path_factory.mktemp("tiny-draft"),
        dtype=torch.float32,
        seed=11,
    )
    return {"target": target, "draft": draft}


def _spec(tiny: dict[str, Path], method: str, k: int = 3, draft: str = "draft") -> dict[str, Any]:
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if method == "draft_model":
        spec["model"] = str(tiny[draft])
    return spec


PROMPT = [5, 6, 7, 8, 9, 10]
TEMPERATURE = 0.6
NUM_SEEDS = 160  # one batch: a prefill step, then one verification step (acceptance 0.28)


def test_sampled_tokens_are_distributed_as_plain_sampling(tiny: dict[str, Path]) -> None:
    # The first token is drawn at the prefill (no drafts); the second is the first position a
    # verification decides. Plain decoding gives, per seed, the target's distribution of the
    # second token after the seed's first (its logprobs row over the whole vocabulary): their
    # sum is the expected histogram of the second tokens speculative decoding draws.
    seeds = [
        SamplingParams(max_tokens=3, temperature=TEMPERATURE, seed=1000 + i, ignore_eos=True)
        for i in range(NUM_SEEDS)
    ]
    with_lp = [
        SamplingParams(
            max_tokens=2,
            temperature=TEMPERATURE,
            seed=p.seed,
            ignore_eos=True,
            logprobs=TINY["vocab_size"],
        )
        for p in seeds
    ]
    plain = run(
        make(tiny["target"], None, max_num_seqs=NUM_SEEDS, max_logprobs=TINY["vocab_size"]),
        [PROMPT] * NUM_SEEDS,
        with_lp,
    )
    expected = torch.zeros(TINY["vocab_size"], dtype=torch.float64)
    for req in plain:
        row = Logprobs.concat(req.logprobs, TINY["vocab_size"]).slice(1, 2)  # the second token's
        ids, lps = (
            torch.from_numpy(row.token_ids[0, 1:].astype(np.int64)),
            torch.from_numpy(row.logprobs[0, 1:]),
        )
        expected[ids] += torch.softmax(lps.double() / TEMPERATURE, 0)
    core = make(tiny["target"], _spec(tiny, "draft_model", k=2), max_num_seqs=NUM_SEEDS)
    spec = run(core, [PROMPT] * NUM_SEEDS, seeds)
    assert [r.output_token_ids[0] for r in spec] == [r.output_token_ids[0] for r in plain]
    counts = torch.bincount(
        torch.tensor([r.output_token_ids[1] for r in spec]), minlength=TINY["vocab_size"]
    )
    assert (
        0.1 < core.spec_decode_stats.acceptance_rate < 0.9
    )  # both rules at work: accept and resample
    p_value = chi_square_p_value(*_pool(counts, expected))  # 0.17 at 160 seeds
    assert p_value > 1e-3, p_value


def _pool(counts: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Bins expected below 5 draws are pooled into one (the chi-square approximation).
    small = expected < 5
    c = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    e = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    return c, e / e.sum()


@pytest.mark.parametrize("method", ["draft_model", "ngram_gpu"])
def test_seeded_sampling_repeats_exactly(tiny: dict[str, Path], method: str) -> None:
    prompts = [PROMPT * 3, [3, 4, 3, 4, 3, 4, 3], PROMPT]
    # (top-k and top-p run through the same kernels: tests/kernels/test_sampling_probs.py)
    params = [
        SamplingParams(max_tokens=10, temperature=0.9, seed=s, ignore_eos=True) for s in (5, 6)
    ]
    params.append(
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    )  # greedy beside them
    first = run(make(tiny["target"], _spec(tiny, method)), prompts, params)
    again = run(make(tiny["target"], _spec(tiny, method)), prompts, params)
    assert [r.output_token_ids for r in first] == [r.output_token_ids for r in again]
    plain = run(make(tiny["target"], None), prompts[2:], params[2:])
    assert first[2].output_token_ids == plain[0].output_token_ids


def test_the_target_as_its_own_draft_draws_plain_samplings_tokens(tiny: dict[str, Path]) -> None:
    # Its drafts are drawn with the target's own noise at their positions, and p == q accepts
    # every one: the same tokens as without speculation.
    params = SamplingParams(
        max_tokens=10, temperature=0.9, repetition_penalty=1.3, seed=77, ignore_eos=True
    )
    prompts = [PROMPT, [9, 9, 3, 9, 9, 3]]
    plain = run(make(tiny["target"], None), prompts, params)
    core = make(tiny["target"], _spec(tiny, "draft_model", draft="target"))
    got = run(core, prompts, params)
    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in plain]
    assert core.spec_decode_stats.num_accepted_tokens == core.spec_decode_stats.num_draft_tokens > 0


@pytest.mark.parametrize("method", ["draft_model", "ngram_gpu"])
def test_chunks_preemption_prefix_hits_and_options_keep_plain_outputs(
    tiny: dict[str, Path], method: str
) -> None:
    system = [4, 5, 6, 7] * 6  # a 24-token shared prefix: prefix-cache hits
    prompts = [[*system, 8, 9], [*system, 10], [3, 4] * 15, [11, 12, 13]]
    params = [
        SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(
            max_tokens=12,
            temperature=0,
            ignore_eos=True,
            repetition_penalty=1.4,
            frequency_penalty=0.3,
        ),
        SamplingParams(max_tokens=16, temperature=0, min_tokens=10, prompt_logprobs=1),
        SamplingParams(max_tokens=9, temperature=0, ignore_eos=True, presence_penalty=0.5),
    ]
    kw = {"max_num_batched_tokens": 16, "block_size": 4, "num_kv_blocks": 16, "max_num_seqs": 4}
    plain = run(make(tiny["target"], None, **kw), prompts, params)
    core = make(tiny["target"], _spec(tiny, method, draft="target"), **kw)
    got = run(core, prompts, params)
    assert sum(r.num_preemptions for r in got) > 0 and sum(r.num_cached_tokens for r in got) > 0
    for want, req in zip(plain, got, strict=True):
        assert req.output_token_ids == want.output_token_ids
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in req.logprobs] or [np.zeros((0, 3))]),
            np.concatenate([c.logprobs for c in want.logprobs] or [np.zeros((0, 3))]),
            atol=1e-5,
        )
        got_prompt, want_prompt = (Logprobs.concat(r.prompt_logprobs, 1) for r in (req, want))
        assert np.array_equal(
            got_prompt.token_ids, want_prompt.token_ids
        )  # once per token, chunks aside
        np.testing.assert_allclose(got_prompt.logprobs, want_prompt.logprobs, atol=1e-5)
    stats = core.spec_decode_stats
    assert stats.num_accepted_tokens > 0
    if method == "draft_model":  # a correct draft KV through chunks and recomputes: all accepted
        assert stats.num_accepted_tokens == stats.num_draft_tokens


@pytest.mark.parametrize("method", ["draft_model", "ngram_gpu"])
def test_a_reused_row_carries_nothing_of_its_last_request(
    tiny: dict[str, Path], method: str
) -> None:
    # Rows full of garbage (token and block ids past the vocabulary and the cache included):
    # nothing of it may be read, also where a request has fewer drafts scheduled than the other
    # (different max_tokens) or fewer n-gram matches than drafts scheduled.
    prompts = [PROMPT, [3, 4, 3, 4, 3]]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (11, 7)]
    plain = run(make(tiny["target"], None, max_num_seqs=2), prompts, params)
    core = make(tiny["target"], _spec(tiny, method, draft="target"), max_num_seqs=2)
    states = core.runner.states
    states.arena.copy_(torch.randint(-(2**30), 2**30, states.arena.shape, dtype=torch.int32))
    first = run(core, prompts, params)
    assert int(states.col(Col.NUM_DRAFTS)[0]) > 0  # the rows now hold this life's counters
    second = run(core, prompts[::-1], params[::-1])  # the same rows, each to the other request
    assert [r.output_token_ids for r in first] == [r.output_token_ids for r in plain]
    assert [r.output_token_ids for r in second] == [r.output_token_ids for r in plain[::-1]]
    if method == "draft_model":  # the target as its own draft: each request accepts every draft
        for req in (*first, *second):
            assert req.spec_decode.num_accepted_tokens == req.spec_decode.num_draft_tokens > 0


def test_the_step_stays_asynchronous_and_drafts_stay_on_the_device(tiny: dict[str, Path]) -> None:
    core = make(tiny["target"], _spec(tiny, "draft_model", draft="target", k=3))
    handles, scheduled = [], []
    real = core.runner.execute_model

    def spy(so):
        scheduled.append(so)
        out = real(so)
        handles.append(out)
        return out

    core.runner.execute_model = spy  # type: ignore[method-assign]
    (req,) = run(core, [PROMPT], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    assert len(req.output_token_ids) == 9
    assert all(
        isinstance(h, AsyncOutput)
        for h, so in zip(handles, scheduled, strict=True)
        if not so.is_empty
    )
    drafts = [
        so.scheduled_spec_decode_tokens["r0"]
        for so in scheduled
        if "r0" in so.scheduled_spec_decode_tokens
    ]
    assert drafts and all(
        set(d) == {-1} for d in drafts
    )  # placeholders: no draft id reached the host
    # Planned ahead: the second step (its first verification) was launched before the first's
    # token was known, with k drafts reserved.
    assert scheduled[1].num_scheduled_tokens["r0"] == 4


def test_a_draft_of_another_vocabulary_is_refused_by_name(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    other = write_random_weights(
        {**TINY, "vocab_size": 30}, tmp_path / "other", dtype=torch.float32, seed=1
    )
    with pytest.raises(
        EngineConfigError,
        match=r"draft model .*other has vocab_size 30, the target 24: "
        r"speculative decoding with a draft model needs the same vocabulary",
    ):
        make(tiny["target"], {"method": "draft_model", "model": str(other)})
    with pytest.raises(
        FileNotFoundError,
        match=r"draft model .*missing \(speculative_config\['model'\]\) does not exist",
    ):
        make(tiny["target"], {"method": "draft_model", "model": str(tmp_path / "missing")})
    with pytest.raises(
        EngineConfigError, match="Model Runner V2 does not yet support: speculative method 'ngram'"
    ):
        make(tiny["target"], {"method": "ngram"})
