"""``@triton.jit`` helpers shared by the sampling and logprob kernels: an order-preserving
integer key for float32 values and a running argmax.

Thresholds (the k-th largest logit for top-k, the top-p cut, the k-th largest logprob) are
found by radix selection over the keys, 4 bits per pass (8 passes over the row, 16 candidate
thresholds compared per element), instead of sorting the vocabulary: exact, with a working set
of one block of logits (Alabi et al., "Fast K-selection Algorithms for Graphics Processing
Units", 2012, radix select).
"""

from __future__ import annotations

import torch

from turnout.kernels._triton import tl, triton

#: Radix passes and candidate thresholds per pass: 8 passes of 4 bits cover a 32-bit key.
RADIX_PASSES = 8
RADIX_BITS = 4


#: Widest block on the CPU (the interpreter); tests lower it to cover multi-block loops.
MAX_INTERPRETER_BLOCK = 16384


def vocab_block_size(vocab_size: int, device: torch.device) -> int:
    """Block of a vocabulary-wide kernel: 1024 on a GPU (registers); on the CPU, where the
    interpreter's cost is per operation, not per element, up to ``MAX_INTERPRETER_BLOCK``."""
    if device.type == "cuda":
        return 1024
    block: int = min(triton.next_power_of_2(max(vocab_size, 16)), MAX_INTERPRETER_BLOCK)
    return block


@triton.jit
def _float_key(x):  # type: ignore[no-untyped-def]
    # float32 -> int64 in [0, 2**32), ordered like the floats (NaN aside). -0.0 is made +0.0
    # first so that it ties with +0.0 as a float comparison would.
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return key.to(tl.int64) + 2147483648


@triton.jit
def _radix_candidates(prefix, p):  # type: ignore[no-untyped-def]
    # The 16 thresholds of pass p: prefix with digit d (0..15) in bits [28 - 4p, 32 - 4p).
    shift = tl.full([], 28, tl.int64) - 4 * p  # p: a loop index (int in the interpreter)
    return prefix + (tl.arange(0, 16).to(tl.int64) << shift), shift


@triton.jit
def _radix_advance(prefix, shift, ok):  # type: ignore[no-untyped-def]
    # ok: [16] bool, true for candidates still meeting the target (a prefix of the digits,
    # since counts and masses fall as the threshold rises); digit 0 always qualifies.
    d = tl.maximum(tl.sum(ok.to(tl.int64), axis=0) - 1, 0)
    return prefix + (d << shift)


@triton.jit
def _argmax_update(x, tok, best_val, best_idx):  # type: ignore[no-untyped-def]
    # Running argmax over blocks; ties go to the lowest token id (blocks come in id order and
    # a later block must be strictly larger to win).
    block_max = tl.max(x, axis=0)
    block_idx = tl.min(tl.where(x == block_max, tok, 2147483647), axis=0)
    better = block_max > best_val
    return tl.where(better, block_max, best_val), tl.where(better, block_idx, best_idx)
