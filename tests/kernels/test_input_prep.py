"""runner_v2's input-preparation kernels against their torch references (CPU: interpreter)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, StepCase, step_case

from turnout.kernels.input_ids import prepare_input_ids, prepare_input_ids_ref
from turnout.kernels.logits_indices import compute_logits_indices, compute_logits_indices_ref
from turnout.kernels.positions import prepare_positions, prepare_positions_ref
from turnout.kernels.post_update import post_update, post_update_ref
from turnout.kernels.query_start_loc import prepare_query_start_loc, prepare_query_start_loc_ref
from turnout.kernels.slot_mapping import compute_slot_mapping, compute_slot_mapping_ref
from turnout.kernels.staged_writes import apply_staged_writes, apply_staged_writes_ref

CASES = [(seed, pad) for seed in range(4) for pad in (False, True)]


def _positions(
    case: StepCase, fn=prepare_positions
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qsl = case.query_start_loc()
    positions = torch.full((case.num_tokens_padded,), 12345, dtype=torch.int64, device=DEVICE)
    seq_lens = torch.full((case.num_reqs_padded,), 777, dtype=torch.int32, device=DEVICE)
    fn(case.idx_mapping, case.num_computed, qsl, case.num_reqs, positions, seq_lens)
    return qsl, positions, seq_lens


@pytest.mark.parametrize(("seed", "pad"), CASES)
def test_query_start_loc(seed: int, pad: bool) -> None:
    case = step_case(seed, pad=pad)
    out, ref = (
        torch.full((case.num_reqs_padded + 1,), -9, dtype=torch.int32, device=DEVICE)
        for _ in range(2)
    )
    prepare_query_start_loc(case.num_scheduled, case.num_reqs, out)
    prepare_query_start_loc_ref(case.num_scheduled, case.num_reqs, ref)
    assert torch.equal(out, ref)
    assert torch.equal(out, case.query_start_loc())


@pytest.mark.parametrize(("seed", "pad"), CASES)
def test_positions_and_seq_lens(seed: int, pad: bool) -> None:
    case = step_case(seed, pad=pad)
    _, positions, seq_lens = _positions(case)
    _, positions_ref, seq_lens_ref = _positions(case, prepare_positions_ref)
    assert torch.equal(positions, positions_ref)
    assert torch.equal(seq_lens, seq_lens_ref)
    # The values themselves: last token of request i sits at seq_len - 1.
    rows = case.idx_mapping.long()
    assert torch.equal(seq_lens[: case.num_reqs], case.num_computed[rows] + case.num_scheduled)
    total = int(case.num_scheduled.sum())
    assert (positions[total:] == 0).all() and (seq_lens[case.num_reqs :] == 0).all()


@pytest.mark.parametrize(("seed", "pad"), CASES)
def test_input_ids_take_prompt_from_table_and_decodes_from_last_sampled(
    seed: int, pad: bool
) -> None:
    case = step_case(seed, pad=pad)
    qsl, positions, _ = _positions(case)
    # Scribble over the table beyond prefill_len: decodes must not read it.
    token_ids = case.token_ids.clone()
    for r in range(token_ids.shape[0]):
        token_ids[r, int(case.prefill_len[r]) :] = -5
    out, ref = (
        torch.full((case.num_tokens_padded,), -9, dtype=torch.int64, device=DEVICE)
        for _ in range(2)
    )
    args = (
        case.idx_mapping,
        qsl,
        positions,
        case.prefill_len,
        case.last_sampled,
        token_ids,
        case.num_reqs,
    )
    prepare_input_ids(*args, out)
    prepare_input_ids_ref(*args, ref)
    assert torch.equal(out, ref)
    total = int(case.num_scheduled.sum())
    assert (out[:total] >= 0).all() and (out[total:] == 0).all()
    for i, row in enumerate(case.idx_mapping.tolist()):
        start, end = int(qsl[i]), int(qsl[i + 1])
        for t in range(start, end):
            p = int(positions[t])
            want = (
                case.token_ids[row, p] if p < int(case.prefill_len[row]) else case.last_sampled[row]
            )
            assert int(out[t]) == int(want)


@pytest.mark.parametrize(("seed", "pad"), CASES)
def test_slot_mapping_pads_with_minus_one(seed: int, pad: bool) -> None:
    case = step_case(seed, pad=pad)
    qsl, positions, _ = _positions(case)
    out, ref = (
        torch.full((case.num_tokens_padded,), 99, dtype=torch.int64, device=DEVICE)
        for _ in range(2)
    )
    args = (case.idx_mapping, qsl, positions, case.block_table, case.block_size, case.num_reqs)
    compute_slot_mapping(*args, out)
    compute_slot_mapping_ref(*args, ref)
    assert torch.equal(out, ref)
    total = int(case.num_scheduled.sum())
    assert (out[total:] == -1).all() and (out[:total] >= 0).all()
    assert out.shape[0] - total == (5 if pad else 0)


@pytest.mark.parametrize("seed", range(3))
def test_logits_indices_are_last_tokens(seed: int) -> None:
    case = step_case(seed)
    qsl = case.query_start_loc()
    out, ref = (
        torch.full((case.num_reqs,), -1, dtype=torch.int64, device=DEVICE) for _ in range(2)
    )
    compute_logits_indices(qsl, case.num_reqs, out)
    compute_logits_indices_ref(qsl, case.num_reqs, ref)
    assert torch.equal(out, ref)
    assert torch.equal(out, torch.cumsum(case.num_scheduled, 0) - 1)


@pytest.mark.parametrize("seed", range(4))
def test_post_update_appends_only_for_sampling_requests(seed: int) -> None:
    case = step_case(seed)
    _, _, seq_lens = _positions(case)
    sampled = torch.randint(0, 1000, (case.num_reqs,), dtype=torch.int32).to(DEVICE)
    states = []
    for fn in (post_update, post_update_ref):
        packed = torch.stack([case.num_computed, case.num_tokens, case.last_sampled], 1).clone()
        token_ids = case.token_ids.clone()
        fn(
            case.idx_mapping,
            case.num_scheduled,
            seq_lens,
            sampled,
            packed[:, 0],
            packed[:, 1],
            packed[:, 2],
            token_ids,
            case.num_reqs,
        )
        states.append((packed, token_ids))
    assert torch.equal(states[0][0], states[1][0]) and torch.equal(states[0][1], states[1][1])
    packed, token_ids = states[0]
    for i, row in enumerate(case.idx_mapping.tolist()):
        samples = int(seq_lens[i]) >= int(case.num_tokens[row])
        assert int(packed[row, 0]) == int(case.num_computed[row] + case.num_scheduled[i])
        assert int(packed[row, 1]) == int(case.num_tokens[row]) + samples
        if samples:
            assert int(token_ids[row, int(case.num_tokens[row])]) == int(sampled[i])
            assert int(packed[row, 2]) == int(sampled[i])


def test_staged_writes_scatter_runs() -> None:
    g = torch.Generator().manual_seed(0)
    arena = torch.arange(5000, dtype=torch.int32, device=DEVICE)
    lens = [3, 0, 1500, 7, 1]
    starts = [10, 40, 100, 2000, 4999]
    values = torch.randint(-100, 100, (sum(lens),), generator=g, dtype=torch.int32).to(DEVICE)
    cu = torch.tensor(
        [0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32, device=DEVICE
    )
    offsets = torch.tensor(starts, dtype=torch.int64, device=DEVICE)
    out, ref = arena.clone(), arena.clone()
    apply_staged_writes(out, offsets, cu, values)
    apply_staged_writes_ref(ref, offsets, cu, values)
    assert torch.equal(out, ref)
    assert (
        torch.equal(out[100:1600], values[3:1503]) and int(out[99]) == 99 and int(out[1600]) == 1600
    )


def test_launchers_reject_bad_dtypes() -> None:
    case = step_case(0)
    qsl = case.query_start_loc()
    with pytest.raises(ValueError, match="int64"):
        prepare_positions(
            case.idx_mapping,
            case.num_computed,
            qsl,
            case.num_reqs,
            torch.zeros(5, dtype=torch.int32, device=DEVICE),
            torch.zeros(case.num_reqs, dtype=torch.int32, device=DEVICE),
        )
    with pytest.raises(ValueError, match="cu_num_values"):
        apply_staged_writes(
            torch.zeros(4, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(0, dtype=torch.int32),
        )
