"""EngineCore: bad requests are rejected alone with a clear error; seeding; pooling; errors
reported by the runner finish one request only."""

from __future__ import annotations

import pytest
from replay_runner import ReplayRunner, reference_generate
from test_scheduler import EOS, VOCAB, assert_no_leaks, make_engine, prompt_of

from turnout.engine.config import EngineConfig, SpeculativeConfig
from turnout.engine.core import EngineCore
from turnout.engine.errors import EngineConfigError, InvalidRequestError, UnsupportedOptionError
from turnout.engine.outputs import ModelRunnerOutput
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput

REJECTED = [
    ("empty prompt", [], SamplingParams(), r"the prompt is empty"),
    (
        "longer than max_model_len",
        list(range(1, 66)),
        SamplingParams(),
        r"65 tokens, more than max_model_len=64",
    ),
    (
        "token outside vocab",
        [1, VOCAB],
        SamplingParams(),
        r"token ids \[97\] are outside the vocabulary",
    ),
    (
        "logprobs above max",
        [1, 2],
        SamplingParams(logprobs=6),
        r"logprobs=6 is above the engine's max_logprobs=5",
    ),
    (
        "prompt logprobs above max",
        [1, 2],
        SamplingParams(prompt_logprobs=9),
        r"prompt_logprobs=9 is above",
    ),
    ("stop id outside vocab", [1], SamplingParams(stop_token_ids=[500]), r"stop_token_ids \[500\]"),
]


@pytest.mark.parametrize(
    ("note", "prompt", "params", "message"), REJECTED, ids=[r[0] for r in REJECTED]
)
def test_bad_request_is_rejected_alone(
    note: str, prompt: list[int], params: SamplingParams, message: str
) -> None:
    core, _ = make_engine(max_model_len=64, max_logprobs=5)
    core.add_request("good1", prompt_of(10), SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(InvalidRequestError, match=message):
        core.add_request("bad", prompt, params)
    core.add_request("good2", prompt_of(10, 3), SamplingParams(max_tokens=4, ignore_eos=True))
    done = core.run_until_done()
    assert sorted(r.req_id for r in done) == ["good1", "good2"]
    assert all(len(r.output_token_ids) == 4 for r in done)
    assert_no_leaks(core)


def test_token_ids_of_any_integer_type_are_accepted() -> None:
    # numpy arrays are how token ids often arrive: their elements are not Python ints, and
    # were rejected as "outside the vocabulary" although every id was in range.
    np = pytest.importorskip("numpy")
    core, _ = make_engine()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    core.add_request("list", prompt_of(9), params)
    core.add_request("numpy", np.asarray(prompt_of(9), dtype=np.int32), params)
    done = {r.req_id: r for r in core.run_until_done()}
    assert (
        done["numpy"].prompt_token_ids == prompt_of(9)
        and type(done["numpy"].prompt_token_ids[0]) is int
    )
    assert done["numpy"].output_token_ids == done["list"].output_token_ids
    with pytest.raises(InvalidRequestError, match=r"token ids must be integers, got 2.0 \(float\)"):
        core.add_request("floats", [1, 2.0])
    with pytest.raises(InvalidRequestError, match=r"token ids \[-1\] are outside the vocabulary"):
        core.add_request("negative", np.asarray([3, -1]))
    assert_no_leaks(core)


def test_duplicate_id_and_capacity_and_unchunkable_prompt() -> None:
    core, _ = make_engine(num_blocks=2, block_size=4, max_model_len=64)
    core.add_request("a", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="already in use"):
        core.add_request("a", [1, 2])
    # 2 + 8 tokens, the last one sampled but never computed: 9 tokens of KV.
    with pytest.raises(
        InvalidRequestError, match=r"may need 3 KV blocks \(9 tokens\), the cache has 2"
    ):
        core.add_request("big", [1, 2], SamplingParams(max_tokens=8))
    core2, _ = make_engine(
        max_num_batched_tokens=8, max_model_len=64, runner_kind="pooling", pooling_tasks=("embed",)
    )
    with pytest.raises(InvalidRequestError, match=r"more than max_num_batched_tokens=8.*pooling"):
        core2.add_request("p", list(range(1, 10)), pooling=True)


FITS_EXACTLY = [
    # (note, max_model_len, block_size, num_blocks, prompt length, max_tokens, speculation)
    ("prompt of max_model_len", 64, 16, 4, 64, 5, "none"),
    ("last token never computed", 64, 16, 3, 40, 9, "none"),
    ("to max_model_len with drafts", 64, 16, 4, 60, 10, "right"),
    ("to max_tokens with drafts", 64, 16, 3, 30, 19, "mixed"),
    ("one-token blocks", 32, 1, 20, 12, 9, "right"),
]


# Speculation runs on the synchronous loop only (runner_v1; runner_v2 refuses it).
FITS_CASES = [(*f, False) for f in FITS_EXACTLY] + [
    (*f, True) for f in FITS_EXACTLY if f[-1] == "none"
]


@pytest.mark.parametrize(
    (
        "note",
        "max_model_len",
        "block_size",
        "num_blocks",
        "length",
        "max_tokens",
        "propose",
        "async_scheduling",
    ),
    FITS_CASES,
    ids=[f"{c[0]}{' (async)' if c[-1] else ''}" for c in FITS_CASES],
)
def test_a_request_that_fits_the_cache_exactly_is_served(
    note: str,
    max_model_len: int,
    block_size: int,
    num_blocks: int,
    length: int,
    max_tokens: int,
    propose: str,
    async_scheduling: bool,
) -> None:
    # The KV a request can ever hold: its prompt, or every token but the last one sampled
    # (drafts are trimmed to max_tokens / max_model_len): a cache of exactly that many blocks
    # serves it; one block less refuses it.
    spec = SpeculativeConfig(num_speculative_tokens=3) if propose != "none" else None
    kwargs = {"max_model_len": max_model_len, "block_size": block_size, "speculative_config": spec}
    prompt = prompt_of(length)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    core, runner = make_engine(num_blocks=num_blocks, propose=propose, **kwargs)
    core = EngineCore(core.config, runner, num_blocks, async_scheduling=async_scheduling)
    core.add_request("fits", prompt, params)
    (done,) = core.run_until_done()
    want, _ = reference_generate(prompt, params, {EOS}, VOCAB, max_model_len)
    assert done.output_token_ids == want and done.num_preemptions == 0
    assert_no_leaks(core)
    smaller, _ = make_engine(num_blocks=num_blocks - 1, propose=propose, **kwargs)
    with pytest.raises(InvalidRequestError, match=rf"may need {num_blocks} KV blocks"):
        smaller.add_request("too big", prompt, params)


def test_runner_refusal_is_a_clear_error() -> None:
    class Refusing(ReplayRunner):
        def check_sampling_params(self, params: SamplingParams) -> None:
            if params.logits_processors:
                raise UnsupportedOptionError("this runner does not support logits_processors")

    config = EngineConfig(model="replay", vocab_size=VOCAB, max_model_len=64, eos_token_ids=(EOS,))
    runner = Refusing(config)
    runner.initialize_kv_cache(16)
    core = EngineCore(config, runner, 16)
    with pytest.raises(UnsupportedOptionError, match="logits_processors"):
        core.add_request("a", [1], SamplingParams(logits_processors=[lambda o, x: x]))


def test_unseeded_requests_get_reproducible_seeds() -> None:
    seeds = []
    for _ in range(2):
        core, _ = make_engine(seed=7)
        reqs = [
            core.add_request(f"r{i}", [1, 2], SamplingParams(temperature=1.0)) for i in range(3)
        ]
        seeds.append([r.sampling_params.seed for r in reqs])
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 3
    core, _ = make_engine(seed=7)
    assert core.add_request("x", [1], SamplingParams(seed=99)).sampling_params.seed == 99


def test_pooling_requests_run_in_one_step() -> None:
    core, _ = make_engine(
        max_num_batched_tokens=32, runner_kind="pooling", pooling_tasks=("embed",)
    )
    core.add_request("e1", [3, 5, 7], pooling=True)
    core.add_request("e2", list(range(1, 21)), pooling=True)
    core.add_request("e3", list(range(1, 21)), pooling=True)  # 20 + 20 > 32: next step
    first = core.step()
    assert [(r.req_id, r.pooled_output) for r in first] == [("e1", [5.0]), ("e2", [10.5])]
    assert [r.req_id for r in core.step()] == ["e3"]
    assert_no_leaks(core)


def test_runner_error_finishes_one_request() -> None:
    class FailsOne(ReplayRunner):
        def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
            out = super().execute_model(so)
            if "bad" in so.num_scheduled_tokens:
                out.errors["bad"] = "logits processor raised ValueError('boom')"
            return out

    config = EngineConfig(model="replay", vocab_size=VOCAB, max_model_len=64, eos_token_ids=(EOS,))
    runner = FailsOne(config)
    runner.initialize_kv_cache(32)
    core = EngineCore(config, runner, 32)
    core.add_request("bad", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    core.add_request("good", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    done = {r.req_id: r for r in core.run_until_done()}
    assert done["bad"].status.finish_reason == "error" and "boom" in done["bad"].error
    assert done["good"].status.finish_reason == "length" and len(done["good"].output_token_ids) == 5
    assert_no_leaks(core)


BAD_CONFIG = [
    ({"max_model_len": 0}, "max_model_len must be an int >= 1"),
    ({"dtype": "int8"}, "dtype must be"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 8}, "without chunked prefill"),
    ({"cpu_offload_gb": -1.0}, "cpu_offload_gb"),
    ({"runner_kind": "reward"}, "runner_kind"),
    # Non-finite sizes were let through: nan compares false with everything (cpu_offload_gb=nan
    # was silently no offload), inf overflowed int() deep in the runner.
    ({"cpu_offload_gb": float("nan")}, r"cpu_offload_gb must be a finite number >= 0, got nan"),
    ({"cpu_offload_gb": float("inf")}, r"cpu_offload_gb must be a finite number >= 0, got inf"),
    (
        {"kv_cache_memory_gb": float("nan")},
        r"kv_cache_memory_gb must be a finite number > 0, got nan",
    ),
    ({"kv_cache_memory_gb": 0.0}, r"kv_cache_memory_gb must be a finite number > 0, got 0.0"),
    ({"max_logprobs": 2.5}, r"max_logprobs must be an int >= 0, got 2.5"),
    ({"seed": "7"}, r"seed must be an int, got '7'"),
    ({"num_kv_blocks": 1.5}, r"num_kv_blocks must be an int >= 1, got 1.5"),
    ({"device": "xyz"}, r"device must be 'cpu', 'cuda' or 'cuda:N', got 'xyz'"),
    ({"device": "cuda:-1"}, r"device must be 'cpu', 'cuda' or 'cuda:N', got 'cuda:-1'"),
    ({"enable_prefix_caching": "no"}, r"enable_prefix_caching must be a bool, got 'no'"),
    (
        {"eos_token_ids": (2, 10)},
        r"eos_token_ids must be token ids in \[0, vocab_size=10\), got \(2, 10\)",
    ),
    ({"eos_token_ids": ("2",)}, r"eos_token_ids must be token ids"),
    ({"load_format": "safetensors"}, r"load_format must be 'auto' or 'dummy', got 'safetensors'"),
    (
        {"runner_kind": "pooling"},
        r"runner_kind 'pooling' with pooling_tasks \(\): a pooling model serves at least one",
    ),
    ({"pooling_tasks": ("embed",)}, r"runner_kind 'generate' with pooling_tasks \('embed',\)"),
    (
        {"runner_kind": "pooling", "pooling_tasks": ("rank",)},
        r"pooling_tasks must be a tuple of embed, classify, score, reward",
    ),
    ({"runner_kind": "pooling", "pooling_tasks": ["embed"]}, r"pooling_tasks must be a tuple"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_CONFIG)
def test_bad_engine_config(kwargs: dict, message: str) -> None:
    base = {"model": "m", "vocab_size": 10, "max_model_len": 64}
    with pytest.raises(EngineConfigError, match=message):
        EngineConfig(**{**base, **kwargs})


def test_speculative_config_is_checked() -> None:
    with pytest.raises(EngineConfigError, match="'eagle' is not implemented"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(EngineConfigError, match="unknown speculative_config keys"):
        SpeculativeConfig.from_dict({"method": "ngram", "draft_model": "x"})
    with pytest.raises(
        EngineConfigError, match=r"method 'ngram' does not use \(use method 'draft_model'\)"
    ):
        SpeculativeConfig.from_dict({"method": "ngram", "model": "x"})
    with pytest.raises(
        EngineConfigError,
        match=r"'draft_model' needs the draft model: speculative_config\['model'\]",
    ):
        SpeculativeConfig.from_dict({"method": "draft_model"})
    with pytest.raises(EngineConfigError, match=r"'draft_model' needs the draft model: .*got 3"):
        SpeculativeConfig.from_dict({"method": "draft_model", "model": 3})
    # vLLM's spelling: a draft model without a method is draft_model.
    spec = SpeculativeConfig.from_dict({"model": "small", "num_speculative_tokens": 2})
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model", "small", 2)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 5}).num_speculative_tokens == 5
    # Values straight from --speculative-config JSON: a wrong type is named, not a TypeError.
    with pytest.raises(
        EngineConfigError, match=r"num_speculative_tokens must be an int >= 1, got '3'"
    ):
        SpeculativeConfig.from_dict({"num_speculative_tokens": "3"})
    with pytest.raises(EngineConfigError, match=r"prompt_lookup_max must be an int >= 1, got 2.5"):
        SpeculativeConfig.from_dict({"prompt_lookup_max": 2.5})
    with pytest.raises(EngineConfigError, match=r"speculative method 7 is not implemented"):
        SpeculativeConfig.from_dict({"method": 7})
    with pytest.raises(
        EngineConfigError, match=r"speculative_config must be a JSON object .*, got a list"
    ):
        SpeculativeConfig.from_dict([1])  # type: ignore[arg-type]
