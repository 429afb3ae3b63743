"""Every launcher and its reference refuse, before any launch, an argument the kernel would
misread: a strided view of a vector the kernel reads or writes as one run (it takes no stride
for it, so it computed with the wrong elements where the reference, indexing through torch,
did not), a 0-d tensor, a per-request input shorter than the batch. Empty batches run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from kernel_cases import DEVICE, sampling_tables, step_case

from turnout.kernels.causal_conv1d import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)
from turnout.kernels.gumbel_noise import gumbel_noise, gumbel_noise_ref
from turnout.kernels.gumbel_sample import gumbel_sample, gumbel_sample_ref
from turnout.kernels.input_ids import prepare_input_ids, prepare_input_ids_ref
from turnout.kernels.logits_indices import compute_logits_indices, compute_logits_indices_ref
from turnout.kernels.paged_attention import (
    paged_attention,
    paged_attention_ref,
    reshape_and_cache,
    reshape_and_cache_ref,
)
from turnout.kernels.paged_attention_split import paged_attention_split, paged_attention_split_ref
from turnout.kernels.penalties import build_penalty_counts, build_penalty_counts_ref
from turnout.kernels.positions import prepare_positions, prepare_positions_ref
from turnout.kernels.post_update import post_update, post_update_ref
from turnout.kernels.query_start_loc import prepare_query_start_loc, prepare_query_start_loc_ref
from turnout.kernels.selective_scan import (
    selective_scan,
    selective_scan_ref,
    selective_state_update,
    selective_state_update_ref,
)
from turnout.kernels.slot_mapping import compute_slot_mapping, compute_slot_mapping_ref
from turnout.kernels.staged_writes import apply_staged_writes, apply_staged_writes_ref
from turnout.kernels.topk_logprobs import topk_logprobs, topk_logprobs_ref

I32, I64, F32 = torch.int32, torch.int64, torch.float32
VOCAB = 64


def _zeros(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype, device=DEVICE)


def _step(num_reqs: int | None = None) -> dict[str, Any]:
    case = step_case(6, pad=True)  # 3 requests, padded to 6
    n = case.num_reqs if num_reqs is None else num_reqs
    idx = case.idx_mapping[:n]
    qsl = _zeros(case.num_reqs_padded + 1, I32)
    prepare_query_start_loc_ref(case.num_scheduled[:n].contiguous(), n, qsl)
    positions, seq_lens = _zeros(case.num_tokens_padded, I64), _zeros(case.num_reqs_padded, I32)
    prepare_positions_ref(idx, case.num_computed, qsl, n, positions, seq_lens)
    return {
        "case": case,
        "n": n,
        "idx": idx,
        "qsl": qsl,
        "positions": positions,
        "seq_lens": seq_lens,
    }


def _tables() -> dict[str, Any]:
    tables = sampling_tables(12)
    n = 5
    return {
        "tables": tables,
        "idx": torch.arange(n, dtype=I32, device=DEVICE),
        "seq_lens": torch.full((n,), 30, dtype=I32, device=DEVICE),
        "logits": torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(0)).to(DEVICE),
        "token_ids": torch.randint(
            0, VOCAB, (12, 40), dtype=I32, generator=torch.Generator().manual_seed(1)
        ).to(DEVICE),
    }


def _attention() -> dict[str, Any]:
    num_tokens = 6
    return {
        "query": torch.randn(num_tokens, 4, 16).to(DEVICE),
        "kv_cache": torch.zeros(2, 8, 4, 2, 16, device=DEVICE),
        "query_start_loc": torch.tensor([0, 2, 6], dtype=I32, device=DEVICE),
        "seq_lens": torch.tensor([5, 7], dtype=I32, device=DEVICE),
        "block_table": torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32, device=DEVICE),
        "max_query_len": 4,
        "scale": 0.25,
    }


# launcher, reference, arguments: a function of the number of requests (None: the case's own).
Args = Callable[[int | None], dict[str, Any]]


def _qsl_args(n: int | None) -> dict[str, Any]:
    s = _step(n)
    return dict(
        num_scheduled=s["case"].num_scheduled[: s["n"]].contiguous(),
        num_reqs=s["n"],
        query_start_loc_out=_zeros(s["case"].num_reqs_padded + 1, I32),
    )


def _positions_args(n: int | None) -> dict[str, Any]:
    s = _step(n)
    return dict(
        idx_mapping=s["idx"],
        num_computed=s["case"].num_computed,
        query_start_loc=s["qsl"],
        num_reqs=s["n"],
        positions_out=torch.empty_like(s["positions"]),
        seq_lens_out=torch.empty_like(s["seq_lens"]),
    )


def _input_ids_args(n: int | None) -> dict[str, Any]:
    s = _step(n)
    c = s["case"]
    return dict(
        idx_mapping=s["idx"],
        query_start_loc=s["qsl"],
        positions=s["positions"],
        prefill_len=c.prefill_len,
        last_sampled=c.last_sampled,
        token_ids=c.token_ids,
        num_reqs=s["n"],
        input_ids_out=torch.empty_like(s["positions"]),
    )


def _slot_args(n: int | None) -> dict[str, Any]:
    s = _step(n)
    return dict(
        idx_mapping=s["idx"],
        query_start_loc=s["qsl"],
        positions=s["positions"],
        block_table=s["case"].block_table,
        block_size=s["case"].block_size,
        num_reqs=s["n"],
        slot_mapping_out=torch.empty_like(s["positions"]),
    )


def _logits_indices_args(n: int | None) -> dict[str, Any]:
    s = _step(n)
    return dict(query_start_loc=s["qsl"], num_reqs=s["n"], logits_indices_out=_zeros(s["n"], I64))


def _post_update_args(n: int | None) -> dict[str, Any]:
    s = _step(n)
    c = s["case"]
    packed = torch.stack([c.num_computed, c.num_tokens, c.last_sampled], 1).clone()
    return dict(
        idx_mapping=s["idx"],
        num_scheduled=c.num_scheduled[: s["n"]].contiguous(),
        seq_lens=s["seq_lens"],
        sampled=_zeros(s["case"].num_reqs_padded, I32),
        num_computed=packed[:, 0],
        num_tokens=packed[:, 1],
        last_sampled=packed[:, 2],
        token_ids=c.token_ids.clone(),
        num_reqs=s["n"],
    )


def _staged_args(n: int | None) -> dict[str, Any]:
    n = 3 if n is None else n
    return dict(
        dst=_zeros(100, I32),
        dst_offsets=torch.arange(n, dtype=I64, device=DEVICE) * 10,
        cu_num_values=torch.arange(n + 1, dtype=I32, device=DEVICE) * 2,
        values=torch.arange(2 * n, dtype=I32, device=DEVICE),
    )


def _noise_args(n: int | None) -> dict[str, Any]:
    n = 4 if n is None else n
    return dict(
        seeds=torch.arange(n, dtype=I64, device=DEVICE),
        positions=torch.arange(n, dtype=I64, device=DEVICE) + 7,
        vocab_size=VOCAB,
    )


def _sample_args(n: int | None) -> dict[str, Any]:
    t = _tables()
    n = t["idx"].shape[0] if n is None else n
    return dict(
        logits=t["logits"][:n],
        idx_mapping=t["idx"][:n],
        seq_lens=t["seq_lens"][:n],
        tables=t["tables"],
        counts=None,
        sampled_out=_zeros(n, I32),
    )


def _penalty_args(n: int | None) -> dict[str, Any]:
    t = _tables()
    tables = t["tables"]
    n = t["idx"].shape[0] if n is None else n
    return dict(
        idx_mapping=t["idx"][:n],
        seq_lens=t["seq_lens"][:n],
        token_ids=t["token_ids"],
        num_prompt_tokens=tables.num_prompt_tokens,
        repetition_penalty=tables.repetition_penalty,
        frequency_penalty=tables.frequency_penalty,
        presence_penalty=tables.presence_penalty,
        counts_out=torch.zeros(n, VOCAB, dtype=I32, device=DEVICE),
    )


def _topk_args(n: int | None) -> dict[str, Any]:
    t = _tables()
    n = t["idx"].shape[0] if n is None else n
    return dict(
        logits=t["logits"][:n],
        token_ids=_zeros(n, I32) + 3,
        num_logprobs=_zeros(n, I32) + 2,
        topk_ids_out=torch.zeros(n, 2, dtype=I32, device=DEVICE),
        topk_logprobs_out=torch.zeros(n, 2, dtype=F32, device=DEVICE),
        token_logprobs_out=_zeros(n, F32),
        token_ranks_out=_zeros(n, I32),
    )


def _attention_args(n: int | None) -> dict[str, Any]:
    a = _attention()
    if n == 0:
        a.update(
            query=a["query"][:0],
            query_start_loc=a["query_start_loc"][:1],
            seq_lens=a["seq_lens"][:0],
            block_table=a["block_table"][:0],
        )
    return a


def _split_attention_args(n: int | None) -> dict[str, Any]:
    a = _attention_args(n)  # a decode step: one query per request
    a.update(
        query=a["query"][: 2 if n is None else 0],
        max_query_len=1,
        query_start_loc=torch.arange(a["query_start_loc"].shape[0], dtype=I32, device=DEVICE),
    )
    return a


def _cache_args(n: int | None) -> dict[str, Any]:
    n = 3 if n is None else n
    return dict(
        key=torch.randn(n, 2, 16, device=DEVICE),
        value=torch.randn(n, 2, 16, device=DEVICE),
        kv_cache=torch.zeros(2, 8, 4, 2, 16, device=DEVICE),
        slot_mapping=torch.arange(n, dtype=I64, device=DEVICE) * 3,
    )


def _mamba_batch(n: int | None, with_tokens: bool = True) -> dict[str, Any]:
    # 3 requests of 3, 1 and 2 tokens (None) or the first n of them, slots 4, 0, 2 of 5.
    lens = [3, 1, 2][: 3 if n is None else n]
    qsl = torch.tensor(
        [0, *torch.tensor(lens, dtype=I32).cumsum(0).tolist()], dtype=I32, device=DEVICE
    )
    batch = {"state_indices": torch.tensor([4, 0, 2][: len(lens)], dtype=I32, device=DEVICE)}
    if with_tokens:
        init = torch.tensor([True, False, True][: len(lens)], dtype=torch.bool, device=DEVICE)
        batch.update(query_start_loc=qsl, has_initial_state=init)
    return {"num_rows": int(qsl[-1]) if with_tokens else len(lens), **batch}


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(DEVICE)


def _conv_args(n: int | None, with_tokens: bool = True) -> dict[str, Any]:
    b = _mamba_batch(n, with_tokens)
    return dict(
        x=_randn(b.pop("num_rows"), 16),
        weight=_randn(16, 4),
        bias=_randn(16),
        conv_state=_randn(5, 16, 3),
        **b,
    )


def _scan_args(n: int | None, with_tokens: bool = True) -> dict[str, Any]:
    b = _mamba_batch(n, with_tokens)
    rows = b.pop("num_rows")
    return dict(
        x=_randn(rows, 16),
        dt=_randn(rows, 16),
        A=-_randn(16, 4).abs(),
        B=_randn(rows, 4),
        C=_randn(rows, 4),
        D=_randn(16),
        z=_randn(rows, 16),
        dt_bias=_randn(16),
        ssm_state=_randn(5, 16, 4),
        **b,
    )


LAUNCHERS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Args, tuple[str, ...]]] = {
    # name: (launcher, reference, arguments, the vectors read or written as one run)
    "query_start_loc": (
        prepare_query_start_loc,
        prepare_query_start_loc_ref,
        _qsl_args,
        ("num_scheduled", "query_start_loc_out"),
    ),
    "positions": (
        prepare_positions,
        prepare_positions_ref,
        _positions_args,
        ("idx_mapping", "query_start_loc", "positions_out", "seq_lens_out"),
    ),
    "input_ids": (
        prepare_input_ids,
        prepare_input_ids_ref,
        _input_ids_args,
        ("idx_mapping", "query_start_loc", "positions", "input_ids_out"),
    ),
    "slot_mapping": (
        compute_slot_mapping,
        compute_slot_mapping_ref,
        _slot_args,
        ("idx_mapping", "query_start_loc", "positions", "slot_mapping_out"),
    ),
    "logits_indices": (
        compute_logits_indices,
        compute_logits_indices_ref,
        _logits_indices_args,
        ("query_start_loc", "logits_indices_out"),
    ),
    "post_update": (
        post_update,
        post_update_ref,
        _post_update_args,
        ("idx_mapping", "num_scheduled", "seq_lens", "sampled"),
    ),
    "staged_writes": (
        apply_staged_writes,
        apply_staged_writes_ref,
        _staged_args,
        ("dst", "dst_offsets", "cu_num_values", "values"),
    ),
    "gumbel_noise": (gumbel_noise, gumbel_noise_ref, _noise_args, ("seeds", "positions")),
    "gumbel_sample": (
        gumbel_sample,
        gumbel_sample_ref,
        _sample_args,
        ("idx_mapping", "seq_lens", "sampled_out"),
    ),
    "penalties": (
        build_penalty_counts,
        build_penalty_counts_ref,
        _penalty_args,
        ("idx_mapping", "seq_lens"),
    ),
    "topk_logprobs": (
        topk_logprobs,
        topk_logprobs_ref,
        _topk_args,
        ("token_ids", "num_logprobs", "token_logprobs_out", "token_ranks_out"),
    ),
    "paged_attention": (
        paged_attention,
        paged_attention_ref,
        _attention_args,
        ("query_start_loc", "seq_lens"),
    ),
    "paged_attention_split": (
        paged_attention_split,
        paged_attention_split_ref,
        _split_attention_args,
        ("query_start_loc", "seq_lens"),
    ),
    "reshape_and_cache": (reshape_and_cache, reshape_and_cache_ref, _cache_args, ("slot_mapping",)),
    "causal_conv1d": (
        causal_conv1d,
        causal_conv1d_ref,
        _conv_args,
        ("query_start_loc", "state_indices", "has_initial_state", "bias"),
    ),
    "causal_conv1d_update": (
        causal_conv1d_update,
        causal_conv1d_update_ref,
        lambda n: _conv_args(n, with_tokens=False),
        ("state_indices", "bias"),
    ),
    "selective_scan": (
        selective_scan,
        selective_scan_ref,
        _scan_args,
        ("query_start_loc", "state_indices", "has_initial_state", "D", "dt_bias"),
    ),
    "selective_state_update": (
        selective_state_update,
        selective_state_update_ref,
        lambda n: _scan_args(n, with_tokens=False),
        ("state_indices", "D", "dt_bias"),
    ),
}
FLAT = [(name, arg) for name, (*_, flat) in LAUNCHERS.items() for arg in flat]


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view with stride 2."""
    view = torch.stack([t, torch.zeros_like(t)], 1)[:, 0]
    assert torch.equal(view, t) and view.stride() == (2,)
    return view


@pytest.mark.parametrize(("name", "arg"), FLAT, ids=[f"{n}-{a}" for n, a in FLAT])
def test_a_strided_vector_is_refused_by_launcher_and_reference(name: str, arg: str) -> None:
    launcher, reference, make, _ = LAUNCHERS[name]
    for fn in (launcher, reference):
        args = make(None)
        args[arg] = _strided(args[arg])
        with pytest.raises(ValueError, match=rf"^{arg} must be .*unit stride"):
            fn(**args)


@pytest.mark.parametrize(("name", "arg"), FLAT, ids=[f"{n}-{a}" for n, a in FLAT])
def test_a_0d_tensor_is_a_value_error_naming_it(name: str, arg: str) -> None:
    launcher, reference, make, _ = LAUNCHERS[name]
    for fn in (launcher, reference):
        args = make(None)
        args[arg] = args[arg][0].clone()
        with pytest.raises(ValueError, match=rf"^{arg} must be"):
            fn(**args)


def test_penalties_refuse_seq_lens_shorter_than_the_batch() -> None:
    # The kernel read seq_lens[i] for every request i: past the end of a short one.
    for fn in (build_penalty_counts, build_penalty_counts_ref):
        args = _penalty_args(None)
        args["seq_lens"] = args["seq_lens"][:2]
        with pytest.raises(ValueError, match=r"^num_reqs=5 exceeds seq_lens \(2 entries\)$"):
            fn(**args)


def test_paged_attention_refuses_a_block_table_with_fewer_rows_than_requests() -> None:
    # The kernel read row i of the block table for every request i: past the end.
    for fn in (
        paged_attention,
        paged_attention_ref,
        paged_attention_split,
        paged_attention_split_ref,
    ):
        args = _attention_args(None) if "split" not in fn.__name__ else _split_attention_args(None)
        args["block_table"] = args["block_table"][:1]
        with pytest.raises(ValueError, match=r"^num_reqs=2 exceeds block_table \(1 entries\)$"):
            fn(**args)


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_an_empty_batch_runs_and_matches_the_reference(name: str) -> None:
    launcher, reference, make, _ = LAUNCHERS[name]
    outs = []
    for fn in (launcher, reference):
        args = make(0)
        result = fn(**args)
        outs.append((result, args))
    (res_k, args_k), (res_r, args_r) = outs
    if isinstance(res_k, torch.Tensor):
        assert torch.equal(res_k, res_r)
    for key, value in args_k.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, args_r[key]), key
