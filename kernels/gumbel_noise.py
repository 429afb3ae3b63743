"""Stateless sampling noise shared by both runners (docs/architecture.md §5.5).

turnout defines the noise of seeded sampling as a pure function of ``(seed, position, token_id)``
so that the same seed gives the same tokens on runner_v1 (torch, CPU-prepared) and runner_v2
(Triton, GPU-resident), whatever the batch composition or step order:

    h = fmix32(fmix32(fmix32(fmix32(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ position_lo) ^ token_id)
    u = ((h >> 8) + 0.5) / 2**24                # uniform in (0, 1), exact in float32
    g = -log(-log(u))                            # standard Gumbel

``fmix32`` is MurmurHash3's 32-bit finaliser (Appleby, MurmurHash3, public domain).
Sampling is then ``argmax(logits / temperature + g)`` over the tokens left after top-k/top-p
(the Gumbel-max trick: Gumbel 1954; Maddison et al. 2014), which draws exactly from the
softmax of the processed logits. ``position`` is the position of the token being sampled
(the index it will take in the request's sequence).

Speculative decoding draws two more kinds of noise from the same hash, in streams of their own
(``kernels/rejection_sample.py``): the uniform that accepts or rejects a draft token at
``position`` is ``u`` of the hash with ``token_id = ACCEPT_DRAW`` (an id no vocabulary has),
and the Gumbel noise of the residual draw after a rejection is ``g`` with the position
``position + RESIDUAL_STREAM`` (bit 31 set: no real position has it).

``gumbel_noise`` is the Triton launcher; ``gumbel_noise_ref`` is the torch reference runner_v1
uses. ``_fmix32`` and ``_gumbel_from_hash`` are ``@triton.jit`` helpers that sampling kernels
call inline so that they reproduce the reference bit for bit in the hash (the final ``log`` may
differ by an ulp between libraries, which cannot change an argmax short of an exact tie).
"""

from __future__ import annotations

import torch

from turnout.kernels._checks import check_dtypes, check_flat, check_matrix
from turnout.kernels._triton import require_triton, tl, triton

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_C1 = 0x85EBCA6B
_C2 = 0xC2B2AE35
#: The "token id" of the uniform that accepts or rejects a draft token (no vocabulary has it).
ACCEPT_DRAW = 0xFFFFFFFF
#: Added to the position for the Gumbel noise of a residual draw (no position reaches 2**31).
RESIDUAL_STREAM = 1 << 31


@triton.jit
def _fmix32(x):  # type: ignore[no-untyped-def]
    # x: uint64 holding a 32-bit value; products stay below 2**64, masks keep 32 bits.
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    return x


@triton.jit
def _row_hash(seed, position):  # type: ignore[no-untyped-def]
    # seed, position: int64 scalars -> uint64 holding the 32-bit per-row hash state.
    s = seed.to(tl.uint64)
    h = _fmix32((s & 0xFFFFFFFF) ^ 0x9E3779B9)
    h = _fmix32(h ^ ((s >> 32) & 0xFFFFFFFF))
    h = _fmix32(h ^ (position.to(tl.uint64) & 0xFFFFFFFF))
    return h


@triton.jit
def _fmix32_u32(x):  # type: ignore[no-untyped-def]
    # The same finaliser in native 32-bit arithmetic (x: uint32; products wrap mod 2**32, which
    # is what the masks of _fmix32 compute). Per token this is the sampler's inner loop: a
    # 64-bit multiply is several 32-bit ones on a GPU, and the 256 x 151,936 noise of one step
    # made the sampler bound by integer arithmetic, not by reading the logits.
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    x = x ^ (x >> 16)
    return x


@triton.jit
def _gumbel_from_hash(row_h, token_ids):  # type: ignore[no-untyped-def]
    # row_h: uint64 from _row_hash; token_ids: int32 block -> float32 Gumbel noise block.
    h = _fmix32_u32(row_h.to(tl.uint32) ^ token_ids.to(tl.uint32))
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def _uniform_from_hash(row_h, token_id):  # type: ignore[no-untyped-def]
    # row_h: uint64 from _row_hash; token_id: a scalar or block of ids (any int type) -> the
    # float32 uniform in (0, 1) that _gumbel_from_hash turns into Gumbel noise.
    h = _fmix32_u32(row_h.to(tl.uint32) ^ token_id.to(tl.uint32))
    return ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit  # type: ignore[untyped-decorator]
def _gumbel_noise_kernel(  # type: ignore[no-untyped-def]
    seeds_ptr,
    positions_ptr,
    out_ptr,
    out_stride,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    seed = tl.load(seeds_ptr + row)
    position = tl.load(positions_ptr + row)
    row_h = _row_hash(seed, position)
    token_ids = block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = token_ids < vocab_size
    g = _gumbel_from_hash(row_h, token_ids)
    tl.store(out_ptr + row * out_stride + token_ids, g, mask=mask)


def gumbel_noise(
    seeds: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64, position of the token being sampled
    vocab_size: int,
    out: torch.Tensor | None = None,  # [num_rows, vocab_size] float32, written in place
) -> torch.Tensor:  # [num_rows, vocab_size] float32
    """Gumbel noise for each (row, token) from the stateless hash above (Triton).

    Raises:
        TritonUnavailableError: Triton is not installed.
        ValueError: dtypes or shapes do not match the annotations.
    """
    require_triton()
    _check(seeds, positions)
    num_rows = seeds.shape[0]
    if out is None:
        out = torch.empty(num_rows, vocab_size, dtype=torch.float32, device=seeds.device)
    check_matrix("out", out, torch.float32, "[num_rows, vocab_size]", num_rows, vocab_size)
    if num_rows == 0:
        return out
    block_size = 1024
    grid = (num_rows, triton.cdiv(vocab_size, block_size))
    _gumbel_noise_kernel[grid](
        seeds, positions, out, out.stride(0), vocab_size, BLOCK_SIZE=block_size
    )
    return out


def _fmix32_ref(x: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic: the product may wrap, but its low 32 bits (all we keep) stay exact.
    x = x ^ (x >> 16)
    x = (x * _C1) & _MASK32
    x = x ^ (x >> 13)
    x = (x * _C2) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise_ref(
    seeds: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64
    vocab_size: int,
    token_ids: torch.Tensor | None = None,  # [vocab_size] or [num_rows, k] int64, default arange
) -> torch.Tensor:  # [num_rows, vocab_size] (or [num_rows, k]) float32
    """Torch reference of :func:`gumbel_noise`; runner_v1 samples with it.

    ``token_ids`` restricts the noise to given tokens (e.g. the top-k candidates) so that a
    sampler need not materialise the whole vocabulary; the values equal the full table's.

    Raises:
        ValueError: dtypes or shapes do not match the annotations.
    """
    _check(seeds, positions)
    s = seeds.to(torch.int64)
    h = _fmix32_ref((s & _MASK32) ^ _GOLDEN)
    h = _fmix32_ref(h ^ ((s >> 32) & _MASK32))
    h = _fmix32_ref(h ^ (positions.to(torch.int64) & _MASK32))
    if token_ids is None:
        token_ids = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    tok = token_ids.to(torch.int64)
    if tok.dim() == 1:
        tok = tok.unsqueeze(0)
    h = _fmix32_ref(h.unsqueeze(1) ^ tok)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    return -torch.log(-torch.log(u))


def uniform_noise_ref(
    seeds: torch.Tensor,  # [num_rows] int64
    positions: torch.Tensor,  # [num_rows] int64
    token_ids: torch.Tensor,  # [num_rows, k] int64 (ACCEPT_DRAW for the acceptance uniform)
) -> torch.Tensor:  # [num_rows, k] float32 in (0, 1)
    """The uniform ``u`` of the hash above (before the Gumbel transform), torch.

    Raises:
        ValueError: dtypes or shapes do not match the annotations.
    """
    _check(seeds, positions)
    s = seeds.to(torch.int64)
    h = _fmix32_ref((s & _MASK32) ^ _GOLDEN)
    h = _fmix32_ref(h ^ ((s >> 32) & _MASK32))
    h = _fmix32_ref(h ^ (positions.to(torch.int64) & _MASK32))
    h = _fmix32_ref(h.unsqueeze(1) ^ (token_ids.to(torch.int64) & _MASK32))
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


def _check(seeds: torch.Tensor, positions: torch.Tensor) -> None:
    check_dtypes(seeds=(seeds, torch.int64), positions=(positions, torch.int64))
    check_flat(seeds=seeds, positions=positions)
    if seeds.shape != positions.shape:
        raise ValueError(
            f"seeds {tuple(seeds.shape)} and positions {tuple(positions.shape)} must be equal 1-D"
        )


__all__ = [
    "ACCEPT_DRAW",
    "RESIDUAL_STREAM",
    "gumbel_noise",
    "gumbel_noise_ref",
    "uniform_noise_ref",
]
