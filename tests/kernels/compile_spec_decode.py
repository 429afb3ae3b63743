"""Compile the speculative-decoding kernels (rejection sampling, processed probabilities, GPU
n-gram proposals, the speculative post-update) for sm_90 (H100/H200) without a GPU, in the
variants runner_v2 launches: greedy-only and sampled, with draft probabilities (draft model) and
one-hot drafts (n-gram), k = 1, 3 and 5 over a Qwen3-sized vocabulary. Reuses
compile_for_gpu.py's launch capture; run without TRITON_INTERPRET
(test_spec_decode_compiles.py does). Prints one line per variant."""

from __future__ import annotations

import os
import sys

import torch

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(__file__))

import triton
from compile_for_gpu import CAPTURED, _capture, _signature
from kernel_cases import sampling_tables
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

VOCAB, MAX_NUM_SEQS, MAX_MODEL_LEN = 151936, 8, 256
I32 = torch.int32


def _launch_all() -> None:
    import turnout.kernels._select as select
    from turnout.kernels.ngram_propose import ngram_propose
    from turnout.kernels.rejection_sample import rejection_sample
    from turnout.kernels.sampling_probs import compute_probs
    from turnout.kernels.spec_post_update import post_update_spec

    select.MAX_INTERPRETER_BLOCK = 1024  # the GPU's block width
    tables = sampling_tables(MAX_NUM_SEQS, seed=0)
    token_ids = torch.zeros(MAX_NUM_SEQS, MAX_MODEL_LEN, dtype=I32)
    params = torch.zeros(MAX_NUM_SEQS, 16, dtype=I32)
    n = 4
    rows = torch.arange(n, dtype=I32)
    for k in (1, 3, 5):
        num_rows = n * (k + 1)
        logits = torch.zeros(num_rows, VOCAB)
        row_idx = torch.arange(num_rows, dtype=I32) % MAX_NUM_SEQS
        positions = torch.zeros(num_rows, dtype=I32)
        probs = torch.zeros(num_rows, VOCAB)
        for counts in (None, torch.zeros(num_rows, VOCAB, dtype=I32)):
            compute_probs(logits, row_idx, positions, tables, counts, probs)
        cu = torch.arange(0, num_rows + 1, k + 1, dtype=I32)
        drafts = torch.zeros(n, k, dtype=I32)
        out = torch.zeros(n, k + 1, dtype=I32)
        num = torch.zeros(n, dtype=I32)
        for tp, dp in ((None, None), (probs, None), (probs, torch.zeros(n, k, VOCAB))):
            rejection_sample(
                cu,
                rows,
                num,
                drafts,
                positions,
                positions,
                tp,
                dp,
                tables.temperature,
                tables.seed,
                out,
                num,
            )
        ngram_propose(rows, num, params[:, 1], token_ids, 1, 4, drafts, num)
        post_update_spec(
            rows,
            num,
            num,
            num,
            out,
            num,
            num,
            params[:, 0],
            params[:, 1],
            params[:, 4],
            params[:, 14],
            params[:, 15],
            token_ids,
        )


def main() -> int:
    JITFunction.run = _capture
    _launch_all()
    target = GPUTarget("cuda", 90, 32)
    seen = set()
    for fn, args, kwargs in CAPTURED:
        signature, constexprs, options = _signature(fn, args, kwargs)
        key = (
            fn.__name__,
            tuple(sorted(signature.items())),
            tuple(sorted(constexprs.items())),
            tuple(sorted(options.items())),
        )
        if key in seen:
            continue
        seen.add(key)
        compiled = triton.compile(
            ASTSource(fn, signature, constexprs), target=target, options=options
        )
        print(
            f"compiled {fn.__name__} {constexprs} {options}: {len(compiled.asm['cubin'])} bytes of cubin"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
