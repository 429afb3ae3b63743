"""The launchers' shared argument checks: each error names the argument, what it must be and
what came (kernels/_checks.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from turnout.kernels._checks import (
    check_at_least,
    check_contiguous,
    check_dtypes,
    check_flat,
    check_matrix,
    check_num_reqs,
    check_out_like,
    check_table,
    check_vector,
    shared_stride,
)

I32, I64, F32 = torch.int32, torch.int64, torch.float32
TABLE = torch.zeros(4, 6, dtype=I32)

CASES: list[tuple[str, Callable[[], object], str]] = [
    (
        "dtype",
        lambda: check_dtypes(seq_lens=(torch.zeros(2, dtype=I64), I32)),
        r"^seq_lens must be int32, got int64$",
    ),
    (
        "contiguity",
        lambda: check_contiguous(dst=TABLE[:, 0]),
        r"^dst must be contiguous, got strides \(6,\)$",
    ),
    (
        "table rank",
        lambda: check_table("token_ids", torch.zeros(3, dtype=I32)),
        r"^token_ids must be a 2-D table with unit inner stride, got shape \(3,\), strides \(1,\)$",
    ),
    (
        "table inner stride",
        lambda: check_table("block_table", TABLE.t()),
        r"^block_table must be a 2-D table .* got shape \(6, 4\), strides \(1, 6\)$",
    ),
    (
        "matrix dtype",
        lambda: check_matrix("logits", TABLE, F32, "[num_reqs, vocab_size]"),
        r"^logits must be \[num_reqs, vocab_size\] float32 with unit inner stride, got \(4, 6\) int32",
    ),
    (
        "matrix rows",
        lambda: check_matrix("counts_out", TABLE, I32, "[num_reqs, vocab_size]", num_rows=3),
        r"^counts_out must be \[num_reqs, vocab_size\] int32 .* got \(4, 6\) int32",
    ),
    (
        "matrix 1-D",
        lambda: check_matrix("out", torch.zeros(4), F32, "[num_rows, vocab_size]", 4, 1),
        r"^out must be \[num_rows, vocab_size\] float32 .* got \(4,\) float32",
    ),
    (
        "vector length",
        lambda: check_vector("token_ids", torch.zeros(3, dtype=I32), I32, 2),
        r"^token_ids must be \[2\] int32 with unit stride, got \(3,\) int32, strides \(1,\)$",
    ),
    (
        "vector dtype",
        lambda: check_vector("slot_mapping", torch.zeros(2, dtype=I32), I64, 2),
        r"^slot_mapping must be \[2\] int64 with unit stride, got \(2,\) int32",
    ),
    (
        "vector stride",
        lambda: check_vector("token_ids", TABLE[:, 0], I32, 4),
        r"^token_ids must be \[4\] int32 with unit stride, got \(4,\) int32, strides \(6,\)$",
    ),
    (
        "flat stride",
        lambda: check_flat(idx_mapping=TABLE[:, 0]),
        r"^idx_mapping must be a 1-D vector with unit stride \(one run of elements\), got shape "
        r"\(4,\), strides \(6,\)$",
    ),
    (
        "flat rank",
        lambda: check_flat(seq_lens=TABLE),
        r"^seq_lens must be a 1-D vector with unit stride .* got shape \(4, 6\)",
    ),
    (
        "0-d count",
        lambda: check_at_least(1, "num_reqs", seq_lens=torch.tensor(3)),
        r"^seq_lens must have num_reqs entries at least, got a 0-d tensor$",
    ),
    (
        "negative count",
        lambda: check_at_least(-1, "num_reqs", idx_mapping=torch.zeros(2)),
        r"^num_reqs must be >= 0, got -1$",
    ),
    (
        "short input",
        lambda: check_at_least(3, "num_reqs", idx_mapping=torch.zeros(3), sampled=torch.zeros(2)),
        r"^num_reqs=3 exceeds sampled \(2 entries\)$",
    ),
    (
        "query_start_loc short",
        lambda: check_num_reqs(2, torch.zeros(2), torch.zeros(2)),
        r"^num_reqs \+ 1=3 exceeds query_start_loc \(2 entries\)$",
    ),
    (
        "out shape",
        lambda: check_out_like("input_ids_out", torch.zeros(4), "positions", torch.zeros(5)),
        r"^input_ids_out must be contiguous with the \(padded\) shape of positions \(5,\), got \(4,\)",
    ),
    (
        "strides",
        lambda: shared_stride("the parameter columns", TABLE[:, 0], torch.zeros(4)),
        r"^the parameter columns must share one stride \(one packed table\), got strides \[1, 6\]$",
    ),
]


@pytest.mark.parametrize(("note", "call", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_argument_is_named(note: str, call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_good_arguments_pass_and_the_shared_stride_is_returned() -> None:
    check_dtypes(a=(TABLE, I32))
    check_contiguous(a=TABLE)
    check_flat(a=TABLE[0], one=TABLE[:1, 0])  # a single element has any stride
    check_table("t", TABLE)
    check_matrix("m", TABLE, I32, "[rows, cols]", 4, 6)
    check_vector("v", torch.zeros(3, dtype=I32), I32, 3)
    check_at_least(0, "num_reqs", empty=torch.zeros(0))
    check_num_reqs(2, torch.zeros(2), torch.zeros(3))
    check_out_like("out", torch.zeros(5), "positions", torch.zeros(5))
    assert shared_stride("columns", TABLE[:, 0], TABLE[:, 1]) == 6
