"""Small random inputs for the runner_v2 kernels, shared by the kernel-vs-reference tests and
the GPU compile check (``compile_for_gpu.py``). Inputs are drawn on the CPU (seeded) and live
on ``DEVICE``: CUDA where there is one (compiled kernels), else the CPU (the interpreter)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnout.kernels.gumbel_sample import SamplingTables

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class StepCase:
    """One step over a request table: who is scheduled, with how many tokens, and padding."""

    idx_mapping: torch.Tensor  # [num_reqs] int32
    num_scheduled: torch.Tensor  # [num_reqs] int32
    num_computed: torch.Tensor  # [max_num_seqs] int32 (a strided column)
    prefill_len: torch.Tensor  # [max_num_seqs] int32 (a strided column)
    num_tokens: torch.Tensor  # [max_num_seqs] int32 (a strided column)
    last_sampled: torch.Tensor  # [max_num_seqs] int32 (a strided column)
    token_ids: torch.Tensor  # [max_num_seqs, max_model_len] int32
    block_table: torch.Tensor  # [max_num_seqs, max_blocks] int32
    block_size: int
    num_reqs_padded: int
    num_tokens_padded: int

    @property
    def num_reqs(self) -> int:
        return int(self.idx_mapping.shape[0])

    def query_start_loc(self) -> torch.Tensor:
        qsl = torch.zeros(self.num_reqs_padded + 1, dtype=torch.int32, device=DEVICE)
        qsl[1 : self.num_reqs + 1] = torch.cumsum(self.num_scheduled, 0)
        qsl[self.num_reqs + 1 :] = qsl[self.num_reqs]
        return qsl


def step_case(
    seed: int,
    *,
    max_num_seqs: int = 12,
    max_model_len: int = 300,
    block_size: int = 16,
    pad: bool = False,
) -> StepCase:
    """A table where some rows prefill (chunked or not), some decode; columns are strided
    views of a packed ``[max_num_seqs, 6]`` table as in runner_v2."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.zeros(max_num_seqs, 6, dtype=torch.int32)
    num_reqs = int(torch.randint(1, max_num_seqs + 1, (1,), generator=g))
    rows = torch.randperm(max_num_seqs, generator=g)[:num_reqs].to(torch.int32)
    prefill_len = torch.randint(1, max_model_len // 2, (max_num_seqs,), generator=g)
    num_sampled = torch.randint(0, 4, (max_num_seqs,), generator=g)
    decode = torch.rand(max_num_seqs, generator=g) < 0.5
    num_sampled[~decode] = 0
    num_tokens = prefill_len + num_sampled
    num_computed = torch.where(
        decode, num_tokens - 1, (torch.rand(max_num_seqs, generator=g) * prefill_len.float()).long()
    )
    remaining = num_tokens - num_computed
    chunk = torch.randint(1, 64, (max_num_seqs,), generator=g)
    num_scheduled = torch.minimum(remaining, chunk)[rows.long()].to(torch.int32)
    packed[:, 0], packed[:, 1], packed[:, 2] = (
        num_computed.int(),
        prefill_len.int(),
        num_tokens.int(),
    )
    token_ids = torch.randint(
        0, 1000, (max_num_seqs, max_model_len), generator=g, dtype=torch.int32
    )
    last = token_ids.gather(1, (num_tokens - 1).unsqueeze(1)).squeeze(1)
    packed[:, 3] = torch.where(num_sampled > 0, last, torch.full_like(last, -1))
    max_blocks = -(-max_model_len // block_size)
    block_table = torch.randint(0, 500, (max_num_seqs, max_blocks), generator=g, dtype=torch.int32)
    total = int(num_scheduled.sum())
    packed = packed.to(DEVICE)
    return StepCase(
        idx_mapping=rows.to(DEVICE),
        num_scheduled=num_scheduled.to(DEVICE),
        num_computed=packed[:, 0],
        prefill_len=packed[:, 1],
        num_tokens=packed[:, 2],
        last_sampled=packed[:, 3],
        token_ids=token_ids.to(DEVICE),
        block_table=block_table.to(DEVICE),
        block_size=block_size,
        num_reqs_padded=num_reqs + (3 if pad else 0),
        num_tokens_padded=total + (5 if pad else 0),
    )


def sampling_tables(max_num_seqs: int, *, seed: int = 0, max_stop: int = 4) -> SamplingTables:
    """Varied parameters (greedy, min-p, top-k, top-p, penalties, min_tokens) in a packed
    table."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.zeros(max_num_seqs, 10, dtype=torch.int32)
    f = packed.view(torch.float32)
    s = max_num_seqs
    tables = SamplingTables(
        temperature=f[:, 0],
        top_k=packed[:, 1],
        top_p=f[:, 2],
        min_p=f[:, 8],
        repetition_penalty=f[:, 3],
        frequency_penalty=f[:, 4],
        presence_penalty=f[:, 5],
        min_tokens=packed[:, 6],
        num_prompt_tokens=packed[:, 7],
        seed=torch.randint(-(2**62), 2**62, (s,), generator=g, dtype=torch.int64),
        stop_token_ids=torch.full((s, max_stop), -1, dtype=torch.int32),
    )
    pick = lambda choices: torch.tensor(choices)[torch.randint(0, len(choices), (s,), generator=g)]  # noqa: E731
    tables.temperature.copy_(pick([0.0, 0.3, 0.7, 1.0, 1.5]))
    tables.top_k.copy_(pick([-1, 0, 1, 3, 20, 100000]).int())
    tables.top_p.copy_(pick([1.0, 1.0, 0.95, 0.5, 0.05]))
    tables.repetition_penalty.copy_(pick([1.0, 1.0, 1.3, 0.7]))
    tables.frequency_penalty.copy_(pick([0.0, 0.0, 0.5, -0.4]))
    tables.presence_penalty.copy_(pick([0.0, 0.0, 0.8, -1.0]))
    tables.min_tokens.copy_(pick([0, 0, 50]).int())
    tables.num_prompt_tokens.copy_(pick([5, 10, 20]).int())
    tables.min_p.copy_(pick([0.0, 0.0, 0.02, 0.3, 1.0]))
    tables.stop_token_ids[:, 0] = 3
    tables.stop_token_ids[::2, 1] = 17
    if DEVICE == "cpu":
        return tables
    packed, seed, stop = packed.to(DEVICE), tables.seed.to(DEVICE), tables.stop_token_ids.to(DEVICE)
    f = packed.view(torch.float32)
    return SamplingTables(
        temperature=f[:, 0],
        top_k=packed[:, 1],
        top_p=f[:, 2],
        min_p=f[:, 8],
        repetition_penalty=f[:, 3],
        frequency_penalty=f[:, 4],
        presence_penalty=f[:, 5],
        min_tokens=packed[:, 6],
        num_prompt_tokens=packed[:, 7],
        seed=seed,
        stop_token_ids=stop,
    )
