"""The persistent batch: rows, holes, condense, and rows that carry nothing over when reused."""

from __future__ import annotations

import numpy as np
import pytest

from turnout.runner_v1.block_table import BlockTable
from turnout.runner_v1.input_batch import InputBatch, RequestView


def view(req_id: str, tokens: list[int], **kw: object) -> RequestView:
    return RequestView(
        req_id=req_id, token_ids=tokens, num_prompt_tokens=len(tokens), num_computed_tokens=0, **kw
    )  # type: ignore[arg-type]


def test_rows_fill_holes_and_condense_moves_the_last_rows() -> None:
    batch = InputBatch(max_num_seqs=5, max_model_len=8)
    for i in range(5):
        assert batch.add_request(view(f"r{i}", [i + 1] * (i + 1))) == i
    with pytest.raises(ValueError, match="full"):
        batch.add_request(view("x", [1]))
    batch.remove_request("r1")
    batch.remove_request("r3")
    assert batch.add_request(view("n", [9])) == 1  # lowest hole first
    moves = batch.condense()
    assert moves == [(4, 3)]
    assert batch.req_ids[:4] == ["r0", "n", "r2", "r4"] and batch.req_ids[4] is None
    assert (
        batch.token_ids_np[3, :5].tolist() == [5] * 5
        and batch.token_ids_np[3, 5:].tolist() == [0] * 3
    )
    assert batch.num_tokens_np[3] == 5 and batch.req_id_to_row["r4"] == 3


@pytest.mark.parametrize("removed", [[0], [4], [0, 1, 2, 3, 4], [1, 2], [3, 4], [0, 2, 4]])
def test_condense_keeps_every_request_and_its_data(removed: list[int]) -> None:
    batch = InputBatch(max_num_seqs=5, max_model_len=8)
    table = BlockTable(5, 4, block_size=2)
    for i in range(5):
        row = batch.add_request(
            view(f"r{i}", [i + 10] * (i + 2), seed=100 + i, temperature=0.1 * i, min_p=0.05 * i)
        )
        table.set_row(row, [i, i + 5])
    for i in removed:
        batch.remove_request(f"r{i}")
    for src, dst in batch.condense():
        table.move_row(src, dst)
    left = [f"r{i}" for i in range(5) if i not in removed]
    assert sorted(r for r in batch.req_ids[: batch.num_reqs] if r) == left
    for req_id, row in batch.req_id_to_row.items():
        i = int(req_id[1:])
        assert row < batch.num_reqs
        assert batch.token_ids_np[row, : i + 2].tolist() == [i + 10] * (i + 2)
        assert batch.seeds_np[row] == 100 + i and np.isclose(batch.temperature_np[row], 0.1 * i)
        assert np.isclose(batch.min_p_np[row], 0.05 * i)
        assert (
            table.block_table_np[row, :2].tolist() == [i, i + 5] and table.num_blocks_np[row] == 2
        )


def test_a_reused_row_carries_nothing_over() -> None:
    batch = InputBatch(max_num_seqs=2, max_model_len=8)
    loaded = view(
        "old",
        [7, 7, 7, 7, 7, 7],
        temperature=0.9,
        top_p=0.5,
        top_k=3,
        min_p=0.2,
        seed=5,
        presence_penalty=1.0,
        frequency_penalty=1.0,
        repetition_penalty=1.5,
        min_tokens=4,
        ignore_eos=True,
        logprobs=3,
        prompt_logprobs=2,
        stop_token_ids=(4,),
        logits_processors=(len,),
    )
    fresh = InputBatch(max_num_seqs=2, max_model_len=8)
    row = batch.add_request(loaded)
    batch.append_token_ids(row, [8])
    batch.remove_request("old")
    assert batch.add_request(view("new", [1, 2])) == row
    fresh.add_request(view("new", [1, 2]))
    for name, value in vars(batch).items():
        if name.endswith("_np"):
            assert np.array_equal(value, vars(fresh)[name]), name
    assert batch.stop_token_ids[row] == () and batch.logits_processors[row] == ()


def test_slot_mapping_follows_the_block_table() -> None:
    table = BlockTable(2, 3, block_size=4)
    table.set_row(0, [7, 2])
    table.set_row(1, [5])
    table.append_row(1, [9])
    slots = table.slot_mapping(np.array([0, 0, 0, 1, 1]), np.array([0, 3, 4, 2, 5]))
    assert slots.tolist() == [28, 31, 8, 22, 37]
    with pytest.raises(ValueError, match="exceed the row width"):
        table.append_row(0, [1, 2])
