"""Per-step input preparation of runner_v1, with numpy on the CPU, then copied to the device.

From the persistent batch (rows ``0..num_reqs-1``, already condensed) and the scheduler's
``num_scheduled_tokens``: ``query_start_loc`` (cumsum), ``positions`` (``num_computed +
offset``), ``input_ids`` (gathered from the token table), ``slot_mapping`` (through the block
table), ``seq_lens``, and the logits indices of the tokens to sample (the last token of each
request whose prefill is complete, plus one per draft being verified). This is the MRV1 design
(vLLM ``gpu_model_runner._prepare_inputs`` before V2) that runner_v2 moves to the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.scheduler_output import SchedulerOutput
from turnout.runner_v1.sampler import SamplingMetadata

if TYPE_CHECKING:
    from turnout.runner_v1.block_table import BlockTable
    from turnout.runner_v1.input_batch import InputBatch


@dataclass
class StepInputs:
    """One step's inputs; ``*_np`` arrays are the host copies, indexed by batch row."""

    req_ids: list[str]
    num_scheduled_np: np.ndarray  # [num_reqs] int32
    num_computed_np: np.ndarray  # [num_reqs] int32, before this step
    query_start_loc_np: np.ndarray  # [num_reqs + 1] int32
    input_ids: torch.Tensor  # [num_tokens] int64, on the device
    positions: torch.Tensor  # [num_tokens] int64, on the device
    attn_metadata: AttentionMetadata
    logits_indices: np.ndarray  # [num_samples] int64, token index of each sampled row
    sample_rows: np.ndarray  # [num_samples] int64, batch row of each sampled row
    sample_offsets: np.ndarray  # [num_samples] int64, 0..num_drafts within its request
    drafts: dict[str, list[int]] = field(default_factory=dict)


def build_step_inputs(
    batch: InputBatch, block_table: BlockTable, so: SchedulerOutput, device: torch.device
) -> StepInputs:
    """Inputs of one forward over the batch's rows (drafts are written into the token table)."""
    n = batch.num_reqs
    req_ids = [r for r in batch.req_ids[:n] if r is not None]
    assert len(req_ids) == n, "the batch must be condensed"
    num_sched = np.array([so.num_scheduled_tokens[r] for r in req_ids], np.int32)
    drafts = {
        r: list(so.scheduled_spec_decode_tokens[r])
        for r in req_ids
        if r in so.scheduled_spec_decode_tokens
    }
    for req_id, ids in drafts.items():
        row, start = (
            batch.req_id_to_row[req_id],
            int(batch.num_tokens_np[batch.req_id_to_row[req_id]]),
        )
        batch.token_ids_np[row, start : start + len(ids)] = ids
    qsl = np.zeros(n + 1, np.int32)
    np.cumsum(num_sched, out=qsl[1:])
    total = int(qsl[-1])
    token_rows = np.repeat(np.arange(n), num_sched)
    num_computed = batch.num_computed_tokens_np[:n].copy()
    positions = (num_computed[token_rows] + np.arange(total) - qsl[:-1][token_rows]).astype(
        np.int64
    )
    input_ids = batch.token_ids_np[token_rows, positions].astype(np.int64)
    slot_mapping = block_table.slot_mapping(token_rows, positions)
    seq_lens = (num_computed + num_sched).astype(np.int32)
    logits_indices, sample_rows, offsets = _sample_positions(batch, req_ids, drafts, qsl, seq_lens)
    md = AttentionMetadata(
        query_start_loc=torch.from_numpy(qsl).to(device),
        seq_lens=torch.from_numpy(seq_lens).to(device),
        # The whole block table of the batch's rows, every step (MRV1).
        block_table=torch.from_numpy(block_table.block_table_np[:n]).to(device),
        slot_mapping=torch.from_numpy(slot_mapping).to(device),
        max_query_len=int(num_sched.max()),
        max_seq_len=int(seq_lens.max()),
        num_actual_tokens=total,
        block_size=block_table.block_size,
    )
    return StepInputs(
        req_ids=req_ids,
        num_scheduled_np=num_sched,
        num_computed_np=num_computed,
        query_start_loc_np=qsl,
        input_ids=torch.from_numpy(input_ids).to(device),
        positions=torch.from_numpy(positions).to(device),
        attn_metadata=md,
        logits_indices=logits_indices,
        sample_rows=sample_rows,
        sample_offsets=offsets,
        drafts=drafts,
    )


def _sample_positions(
    batch: InputBatch,
    req_ids: list[str],
    drafts: dict[str, list[int]],
    qsl: np.ndarray,
    seq_lens: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # A request samples when this step reaches its last known token (partial prefills do not).
    n = len(req_ids)
    num_drafts = np.array([len(drafts.get(r, ())) for r in req_ids], np.int64)
    samples = seq_lens >= batch.num_tokens_np[:n] + num_drafts
    rows = np.flatnonzero(samples)
    counts = num_drafts[rows] + 1
    sample_rows = np.repeat(rows, counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    logits_indices = qsl[1:][sample_rows].astype(np.int64) - num_drafts[sample_rows] - 1 + offsets
    return logits_indices, sample_rows, offsets


def build_sampling_metadata(
    batch: InputBatch, inputs: StepInputs, eos_token_ids: tuple[int, ...], device: torch.device
) -> SamplingMetadata:
    """Per sampled row: the request's parameters, the position sampled and its history."""
    rows, offsets = inputs.sample_rows, inputs.sample_offsets
    outputs, prompts, masked, processors = [], [], [], []
    needs_penalties = bool(
        (batch.presence_penalty_np[rows] != 0).any()
        or (batch.frequency_penalty_np[rows] != 0).any()
        or (batch.repetition_penalty_np[rows] != 1).any()
    )
    for row, j in zip(rows.tolist(), offsets.tolist(), strict=True):
        drafts = inputs.drafts.get(inputs.req_ids[row], [])[:j]
        out_ids = [*batch.output_token_ids(row).tolist(), *drafts]
        fns = batch.logits_processors[row]
        outputs.append(out_ids)
        prompts.append(batch.prompt_token_ids(row).tolist() if (needs_penalties or fns) else [])
        processors.append(fns)
        masked.append(_min_tokens_mask(batch, row, len(out_ids), eos_token_ids))

    def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    penalties = {}
    if needs_penalties:
        penalties = {
            "presence_penalty": t(batch.presence_penalty_np[rows], torch.float32),
            "frequency_penalty": t(batch.frequency_penalty_np[rows], torch.float32),
            "repetition_penalty": t(batch.repetition_penalty_np[rows], torch.float32),
        }
    min_p = batch.min_p_np[rows]
    min_p_t = t(min_p, torch.float32) if bool((min_p > 0).any()) else None  # None: no softmax
    return SamplingMetadata(
        temperature=t(batch.temperature_np[rows], torch.float32),
        top_k=t(batch.top_k_np[rows], torch.int64),
        top_p=t(batch.top_p_np[rows], torch.float32),
        seeds=t(batch.seeds_np[rows], torch.int64),
        positions=t(batch.num_tokens_np[rows].astype(np.int64) + offsets, torch.int64),
        output_token_ids=outputs,
        prompt_token_ids=prompts,
        masked_token_ids=masked,
        logits_processors=processors,
        min_p=min_p_t,
        **penalties,
    )


def _min_tokens_mask(
    batch: InputBatch, row: int, num_output: int, eos_token_ids: tuple[int, ...]
) -> tuple[int, ...]:
    if num_output >= int(batch.min_tokens_np[row]):
        return ()
    eos = () if batch.ignore_eos_np[row] else eos_token_ids
    return (*batch.stop_token_ids[row], *eos)


__all__ = ["StepInputs", "build_sampling_metadata", "build_step_inputs"]
