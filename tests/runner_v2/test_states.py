"""RequestStates: every field of a row written on add, rows only freed on remove, slots conserved
through 1,000 random adds, finishes and preemptions (the table on the device checked against a
plain-Python model of what each live row must hold)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from turnout.engine.errors import UnsupportedOptionError
from turnout.engine.sampling_params import SamplingParams
from turnout.runner_v2.states import NUM_COLS, Col, RequestStates

EOS = (2, 7)


def make_states(max_num_seqs: int = 8, max_model_len: int = 64) -> RequestStates:
    return RequestStates(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_blocks_per_req=8,
        max_stop_token_ids=4,
        eos_token_ids=EOS,
        device=torch.device("cpu"),
    )


def flush(states: RequestStates) -> None:
    writes = states.take_staged_writes()
    if writes is not None:
        offsets, cu, values = (torch.from_numpy(a) for a in writes)
        states.apply_staged_writes(offsets, cu, values)


def expected_row(
    params: SamplingParams, n: int, n_prompt: int, n_computed: int
) -> dict[str, object]:
    return {
        "num_computed": n_computed,
        "num_tokens": n,
        "prefill_len": n,
        "num_prompt": n_prompt,
        "last": -1,
        "temperature": 0.0 if params.temperature < 1e-5 else np.float32(params.temperature),
        "top_k": params.top_k,
        "top_p": np.float32(params.top_p),
        "min_p": np.float32(params.min_p),
        "rep": np.float32(params.repetition_penalty),
        "freq": np.float32(params.frequency_penalty),
        "pres": np.float32(params.presence_penalty),
        "min_tokens": params.min_tokens,
        "seed": params.seed,
        "logprobs": -1 if params.logprobs is None else params.logprobs,
        "prompt_logprobs": -1 if params.prompt_logprobs is None else params.prompt_logprobs,
        "num_drafts": 0,
        "num_accepted": 0,  # speculative decoding starts afresh
    }


def actual_row(states: RequestStates, row: int) -> dict[str, object]:
    f = lambda c: np.float32(states.col_f32(c)[row])  # noqa: E731
    i = lambda c: int(states.col(c)[row])  # noqa: E731
    return {
        "num_computed": i(Col.NUM_COMPUTED_TOKENS),
        "num_tokens": i(Col.NUM_TOKENS),
        "prefill_len": i(Col.PREFILL_LEN),
        "num_prompt": i(Col.NUM_PROMPT_TOKENS),
        "last": i(Col.LAST_SAMPLED),
        "temperature": f(Col.TEMPERATURE),
        "top_k": i(Col.TOP_K),
        "top_p": f(Col.TOP_P),
        "min_p": f(Col.MIN_P),
        "rep": f(Col.REPETITION_PENALTY),
        "freq": f(Col.FREQUENCY_PENALTY),
        "pres": f(Col.PRESENCE_PENALTY),
        "min_tokens": i(Col.MIN_TOKENS),
        "seed": int(states.seed[row]),
        "logprobs": i(Col.NUM_LOGPROBS),
        "prompt_logprobs": i(Col.NUM_PROMPT_LOGPROBS),
        "num_drafts": i(Col.NUM_DRAFTS),
        "num_accepted": i(Col.NUM_ACCEPTED),
    }


def random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.0, 0.5, 1.3]),
        top_k=rng.choice([-1, 0, 5]),
        top_p=rng.choice([1.0, 0.7]),
        min_p=rng.choice([0.0, 0.1]),
        repetition_penalty=rng.choice([1.0, 1.2]),
        frequency_penalty=rng.choice([0.0, -0.5]),
        presence_penalty=rng.choice([0.0, 1.5]),
        min_tokens=rng.choice([0, 3]),
        max_tokens=10,
        seed=rng.randrange(-(2**63), 2**63),
        stop_token_ids=rng.choice([[], [11], [11, 12]]),
        ignore_eos=rng.random() < 0.3,
        logprobs=rng.choice([None, 0, 4]),
        prompt_logprobs=rng.choice([None, 2]),
    )


def test_add_writes_every_field_of_a_dirty_row() -> None:
    states = make_states()
    states.arena.fill_(-12345)  # a row full of a previous life's values
    params = SamplingParams(
        temperature=0.8,
        top_k=3,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=2,
        seed=-(2**62) - 5,
        stop_token_ids=[9],
        logprobs=2,
    )
    row = states.add_request(
        "a",
        token_ids=[4, 5, 6, 8],
        num_prompt_tokens=3,
        num_computed_tokens=1,
        block_ids=[3, 1],
        params=params,
    )
    flush(states)
    assert actual_row(states, row) == expected_row(params, 4, 3, 1)
    assert states.token_ids[row, :4].tolist() == [4, 5, 6, 8]
    assert states.block_table[row, :2].tolist() == [3, 1]
    assert states.stop_token_ids[row].tolist() == [2, 7, 9, -1]  # EOS ids, then stop ids
    # Every word of the row's parameters was written (none kept the dirty value).
    assert (states.row_params[row] != -12345).all() and len(Col) == NUM_COLS


def test_remove_only_frees_and_a_resumed_request_gets_a_fresh_row() -> None:
    states = make_states(max_num_seqs=2)
    p = SamplingParams(seed=1)
    a = states.add_request(
        "a", token_ids=[1, 2], num_prompt_tokens=2, num_computed_tokens=0, block_ids=[0], params=p
    )
    flush(states)
    before = states.arena.clone()
    info = states.remove_request("a")
    assert info is not None and info.num_prompt_tokens == 2 and info.sampling_params is p
    assert torch.equal(states.arena, before) and states.take_staged_writes() is None
    assert states.remove_request("a") is None
    # Preemption = remove, then add again with the full token list.
    row = states.add_request(
        "a",
        token_ids=[1, 2, 9, 9, 5],
        num_prompt_tokens=2,
        num_computed_tokens=0,
        block_ids=[4, 5],
        params=p,
    )
    flush(states)
    assert row == a and actual_row(states, row) == expected_row(p, 5, 2, 0)
    with pytest.raises(RuntimeError, match="bound already"):
        states.add_request(
            "a", token_ids=[1], num_prompt_tokens=1, num_computed_tokens=0, block_ids=[], params=p
        )


def test_writes_staged_for_a_freed_row_never_meet_its_next_owners() -> None:
    # A step that fails part-way can leave writes staged for rows its requests held; once the
    # engine aborts them, a new request takes the row. The writes of one launch must not
    # overlap (on a GPU which one lands would be a race), so the stale ones are dropped.
    states = make_states(max_num_seqs=2)
    other = states.add_request(
        "other",
        token_ids=[3],
        num_prompt_tokens=1,
        num_computed_tokens=0,
        block_ids=[2],
        params=SamplingParams(seed=4),
    )
    row = states.add_request(
        "old",
        token_ids=[1, 2, 3, 4],
        num_prompt_tokens=4,
        num_computed_tokens=0,
        block_ids=[0],
        params=SamplingParams(seed=1, top_k=9),
    )
    states.append_block_ids("old", [6])
    states.remove_request("old")
    new = SamplingParams(seed=2)
    assert (
        states.add_request(
            "new",
            token_ids=[7, 8],
            num_prompt_tokens=2,
            num_computed_tokens=0,
            block_ids=[5],
            params=new,
        )
        == row
    )
    writes = states.take_staged_writes()
    assert writes is not None
    offsets, cu, values = writes
    spans = sorted((int(o), int(o) + int(cu[i + 1] - cu[i])) for i, o in enumerate(offsets))
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans
    assert len(spans) == 8 and other != row  # 4 tables for each of the two live rows
    states.apply_staged_writes(*(torch.from_numpy(a) for a in (offsets, cu, values)))
    assert actual_row(states, row) == expected_row(new, 2, 2, 0)
    assert states.block_table[row, :1].tolist() == [5] and states.token_ids[row, :2].tolist() == [
        7,
        8,
    ]


def test_block_table_diffs_append() -> None:
    states = make_states()
    states.add_request(
        "a",
        token_ids=[1],
        num_prompt_tokens=1,
        num_computed_tokens=0,
        block_ids=[5],
        params=SamplingParams(),
    )
    states.append_block_ids("a", [6, 7])
    flush(states)
    states.append_block_ids("a", [8])
    flush(states)
    assert states.block_table[states.req_id_to_row["a"], :4].tolist() == [5, 6, 7, 8]


def test_too_many_min_tokens_stop_ids_are_refused() -> None:
    states = make_states()
    with pytest.raises(UnsupportedOptionError, match="at most 4"):
        states.check_sampling_params(SamplingParams(min_tokens=1, stop_token_ids=[10, 11, 12]))
    states.check_sampling_params(SamplingParams(min_tokens=1, stop_token_ids=[10, 11]))
    states.check_sampling_params(SamplingParams(min_tokens=0, stop_token_ids=[10, 11, 12, 13]))


def test_slot_conservation_after_a_thousand_random_operations() -> None:
    rng = random.Random(7)
    s = 8
    states = make_states(max_num_seqs=s)
    live: dict[str, tuple[SamplingParams, list[int], int, list[int]]] = {}
    preempted: dict[str, tuple[SamplingParams, list[int], int]] = {}
    for step in range(1000):
        op = rng.random()
        if (op < 0.45 and len(live) < s) or not live:
            req_id, params = f"r{step}", random_params(rng)
            if preempted and rng.random() < 0.5:  # resume: full token list, kept parameters
                req_id = rng.choice(sorted(preempted))
                params, tokens, n_prompt = preempted.pop(req_id)
                tokens = tokens + [rng.randrange(100) for _ in range(rng.randrange(3))]
            else:
                tokens = [rng.randrange(100) for _ in range(rng.randrange(1, 20))]
                n_prompt = len(tokens)
            blocks = [rng.randrange(50) for _ in range(rng.randrange(1, 4))]
            states.add_request(
                req_id,
                token_ids=tokens,
                num_prompt_tokens=n_prompt,
                num_computed_tokens=0,
                block_ids=blocks,
                params=params,
            )
            live[req_id] = (params, tokens, n_prompt, blocks)
        elif op < 0.7:
            req_id = rng.choice(sorted(live))
            params, tokens, n_prompt, _ = live.pop(req_id)
            assert states.remove_request(req_id) is not None
            preempted[req_id] = (params, tokens, n_prompt)
        elif op < 0.9:
            req_id = rng.choice(sorted(live))
            live.pop(req_id)
            states.remove_request(req_id)
        else:
            req_id = rng.choice(sorted(live))
            extra = [rng.randrange(50)]
            states.append_block_ids(req_id, extra)
            live[req_id][3].append(extra[0])
        if rng.random() < 0.3:
            flush(states)
        # Conservation: every row is either free or bound, never both, never twice.
        bound = sorted(states.req_id_to_row.values())
        assert len(bound) == len(set(bound)) == len(live)
        assert sorted(bound + states.free_rows) == list(range(s))
    flush(states)
    for req_id, (params, tokens, n_prompt, blocks) in live.items():
        row = states.req_id_to_row[req_id]
        assert actual_row(states, row) == expected_row(params, len(tokens), n_prompt, 0)
        assert states.token_ids[row, : len(tokens)].tolist() == tokens
        assert states.block_table[row, : len(blocks)].tolist() == blocks
        masked = (
            ([] if params.ignore_eos else list(EOS)) + list(params.stop_token_ids)
            if params.min_tokens
            else []
        )
        assert states.stop_token_ids[row].tolist() == masked + [-1] * (4 - len(masked))
