"""Test helper: drive a DecoderModel through paged KV caches the way a runner would (blocks
handed out in a scrambled order, so a sequence's blocks are not contiguous). Models with Mamba
layers (a ``HybridCacheSpec``) also get a state slot per sequence, handed out in a scrambled
order too, passed as ``state_indices``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from turnout.engine.model import AttentionMetadata, DecoderModel, allocate_kv_caches
from turnout.engine.model.state_cache import HybridCacheSpec

MAX_STATE_SLOTS = 8


@dataclass
class _Seq:
    token_ids: list[int]
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    state_slot: int = -1


class PagedSession:
    """Sequences sharing paged KV caches; :meth:`step` runs one packed forward."""

    def __init__(
        self, model: DecoderModel, *, num_blocks: int, block_size: int, max_blocks_per_seq: int = 64
    ) -> None:
        p = next(model.parameters())
        self.model = model
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        spec = model.kv_cache_spec
        self.has_state = isinstance(spec, HybridCacheSpec)
        if isinstance(spec, HybridCacheSpec):
            self.kv_caches = spec.allocate(
                num_blocks, block_size, MAX_STATE_SLOTS, p.dtype, p.device
            )
        else:
            self.kv_caches = allocate_kv_caches(spec, num_blocks, block_size, p.dtype, p.device)
        gen = torch.Generator().manual_seed(1)
        self.free_blocks = torch.randperm(num_blocks, generator=gen).tolist()
        self.free_slots = torch.randperm(MAX_STATE_SLOTS, generator=gen).tolist()
        self.seqs: dict[str, _Seq] = {}
        self.device = p.device

    def add(self, seq_id: str, token_ids: list[int]) -> None:
        self.seqs[seq_id] = _Seq(
            list(token_ids), state_slot=self.free_slots.pop() if self.has_state else -1
        )

    def append(self, seq_id: str, token_id: int) -> None:
        self.seqs[seq_id].token_ids.append(token_id)

    def step(self, num_tokens: dict[str, int]) -> dict[str, torch.Tensor]:
        """Run ``num_tokens[seq]`` uncomputed tokens of each sequence in one forward.

        Returns each sequence's logits for the tokens run, ``[n, vocab] float32``.
        """
        ids, positions, slots, qsl, seq_lens, table = [], [], [], [0], [], []
        for seq_id, n in num_tokens.items():
            seq = self.seqs[seq_id]
            start, end = seq.num_computed, seq.num_computed + n
            assert end <= len(seq.token_ids)
            while len(seq.blocks) * self.block_size < end:
                seq.blocks.append(self.free_blocks.pop())
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [
                seq.blocks[p // self.block_size] * self.block_size + p % self.block_size
                for p in range(start, end)
            ]
            qsl.append(qsl[-1] + n)
            seq_lens.append(end)
            table.append(seq.blocks + [0] * (self.max_blocks_per_seq - len(seq.blocks)))
            seq.num_computed = end
        md = AttentionMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            block_table=torch.tensor(table, dtype=torch.int32, device=self.device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            max_query_len=max(num_tokens.values()),
            max_seq_len=max(seq_lens),
            num_actual_tokens=len(ids),
            block_size=self.block_size,
            state_indices=torch.tensor(
                [self.seqs[k].state_slot for k in num_tokens], dtype=torch.int32, device=self.device
            )
            if self.has_state
            else None,
        )
        with torch.inference_mode():
            hidden = self.model(
                torch.tensor(ids, device=self.device),
                torch.tensor(positions, device=self.device),
                self.kv_caches,
                md,
            )
            logits = self.model.compute_logits(hidden)
        return {s: logits[qsl[i] : qsl[i + 1]] for i, s in enumerate(num_tokens)}


def greedy_generate(
    model: DecoderModel,
    prompt: list[int],
    *,
    max_new_tokens: int,
    eos_token_id: int | None,
    block_size: int = 16,
) -> list[int]:
    """A plain greedy loop (prefill, then one token per step) until EOS or the token limit;
    returns the generated ids, EOS included."""
    need = -(-(len(prompt) + max_new_tokens) // block_size)
    session = PagedSession(
        model, num_blocks=need + 4, block_size=block_size, max_blocks_per_seq=need
    )
    session.add("r", prompt)
    out: list[int] = []
    num_tokens = len(prompt)
    while len(out) < max_new_tokens:
        token = int(session.step({"r": num_tokens})["r"][-1].argmax())
        out.append(token)
        if token == eos_token_id:
            break
        session.append("r", token)
        num_tokens = 1
    return out


def run_paged_greedy(
    model: DecoderModel,
    prompts: dict[str, list[int]],
    *,
    block_size: int,
    first_chunk: dict[str, int],
    num_new_tokens: int,
) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
    """Greedy decode of several sequences through shared paged caches: a first step runs
    ``first_chunk[k]`` prompt tokens of each (a chunked prefill), the second the rest of the
    prompts mixed with decodes, then one token per sequence per step. Returns the full
    sequences and the logits of every position run (``[len - 1, vocab]`` float32, on CPU)."""
    session = PagedSession(model, num_blocks=128, block_size=block_size)
    logits: dict[str, list[torch.Tensor]] = {k: [] for k in prompts}
    for k, p in prompts.items():
        session.add(k, p)
    generated = {k: 0 for k in prompts}

    def run(num_tokens: dict[str, int]) -> None:
        for k, out in session.step(num_tokens).items():
            logits[k].append(out.cpu())
            seq = session.seqs[k]
            if seq.num_computed == len(seq.token_ids) and generated[k] < num_new_tokens:
                session.append(k, int(out[-1].argmax()))
                generated[k] += 1

    run(first_chunk)
    run({k: len(s.token_ids) - s.num_computed for k, s in session.seqs.items()})
    while any(n < num_new_tokens for n in generated.values()):
        run({k: 1 for k, n in generated.items() if n < num_new_tokens})
    return (
        {k: s.token_ids for k, s in session.seqs.items()},
        {k: torch.cat(v) for k, v in logits.items()},
    )


def run_paged_forced(
    model: DecoderModel,
    sequences: dict[str, list[int]],
    *,
    block_size: int,
    first_chunk: dict[str, int],
    num_decode: int,
) -> dict[str, torch.Tensor]:
    """Teacher-forced run of fixed sequences: ``first_chunk[k]`` tokens, then all but the last
    ``num_decode``, then those one per step (decode steps). Returns every position's logits
    (``[len, vocab]`` float32, on CPU)."""
    session = PagedSession(model, num_blocks=256, block_size=block_size)
    for k, seq in sequences.items():
        session.add(k, seq)
    logits: dict[str, list[torch.Tensor]] = {k: [] for k in sequences}
    steps = [first_chunk, {k: len(s) - num_decode - first_chunk[k] for k, s in sequences.items()}]
    steps += [{k: 1 for k in sequences}] * num_decode
    for step in steps:
        for k, out in session.step(step).items():
            logits[k].append(out.cpu())
    return {k: torch.cat(v) for k, v in logits.items()}


def check_decode_graph_replay(model: torch.nn.Module) -> None:
    """Four sequences prefilled on ``model`` (CUDA), then three decode steps run eagerly and
    replayed from one CUDA graph captured over static input buffers: each replay's logits must
    equal the eager step's (runner_v2 captures decode steps this way). Raises AssertionError."""
    session = PagedSession(model, num_blocks=64, block_size=4, max_blocks_per_seq=16)
    for i, n in enumerate([5, 9, 12, 3]):
        session.add(f"s{i}", list(range(10 + i, 10 + i + n)))
    for k, out in session.step({k: len(s.token_ids) for k, s in session.seqs.items()}).items():
        session.append(k, int(out[-1].argmax()))
    dev, seqs = "cuda", list(session.seqs.values())
    buf = {
        "ids": torch.zeros(4, dtype=torch.int64, device=dev),
        "pos": torch.zeros(4, dtype=torch.int64, device=dev),
        "slots": torch.zeros(4, dtype=torch.int64, device=dev),
        "qsl": torch.arange(5, dtype=torch.int32, device=dev),
        "seq_lens": torch.zeros(4, dtype=torch.int32, device=dev),
        "table": torch.zeros(4, 16, dtype=torch.int32, device=dev),
    }

    def fill() -> None:  # the next decode step of every sequence, written in place
        for i, s in enumerate(seqs):
            p = len(s.token_ids) - 1
            if len(s.blocks) * 4 <= p:
                s.blocks.append(session.free_blocks.pop())
            buf["ids"][i], buf["pos"][i] = s.token_ids[-1], p
            buf["slots"][i] = s.blocks[p // 4] * 4 + p % 4
            buf["seq_lens"][i] = p + 1
            buf["table"][i, : len(s.blocks)] = torch.tensor(s.blocks)

    md = AttentionMetadata(
        query_start_loc=buf["qsl"],
        seq_lens=buf["seq_lens"],
        block_table=buf["table"],
        slot_mapping=buf["slots"],
        max_query_len=1,
        max_seq_len=64,
        num_actual_tokens=4,
        block_size=4,
    )

    def step() -> torch.Tensor:
        return model.compute_logits(model(buf["ids"], buf["pos"], session.kv_caches, md))

    with torch.inference_mode():
        fill()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up compiles the kernels outside the capture
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = step()
        for _ in range(3):  # KV (or latent) writes are idempotent within a step: eager then replay
            eager = step().clone()
            graph.replay()
            torch.testing.assert_close(static_logits, eager, atol=1e-5, rtol=1e-5)
            for s, tok in zip(seqs, eager.argmax(-1).tolist(), strict=True):
                s.token_ids.append(tok)
            fill()
