"""The stateless sampling noise: Triton kernel vs torch reference, and its distribution."""

from __future__ import annotations

import math

import pytest
import torch

from turnout.kernels._triton import HAS_TRITON
from turnout.kernels.gumbel_noise import gumbel_noise, gumbel_noise_ref

# Triton runs on CPU tensors only through the interpreter (set by tests/conftest.py without CUDA).
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    seeds = torch.tensor([0, 1, 2**40 + 7, -5, 123456789, 42], dtype=torch.int64, device=device)
    positions = torch.tensor([0, 5, 17, 2**33 + 3, 99, 0], dtype=torch.int64, device=device)
    return seeds, positions


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_kernel_matches_reference(device: str) -> None:
    seeds, positions = _inputs(device)
    vocab_size = 2500  # not a multiple of the block: exercises the mask
    out = torch.full((6, vocab_size), float("nan"), device=device)
    gumbel_noise(seeds, positions, vocab_size, out=out)
    ref = gumbel_noise_ref(seeds, positions, vocab_size)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_reference_is_a_pure_function_of_seed_position_token() -> None:
    seeds, positions = _inputs("cpu")
    full = gumbel_noise_ref(seeds, positions, 1000)
    # Same rows in another order and batch size give the same values.
    perm = torch.tensor([3, 0, 5])
    again = gumbel_noise_ref(seeds[perm], positions[perm], 1000)
    assert torch.equal(again, full[perm])
    # A subset of token ids gives the same values as the full table.
    tok = torch.tensor([[7, 999, 0]] * 6)
    sub = gumbel_noise_ref(seeds, positions, 1000, token_ids=tok)
    assert torch.equal(sub, full.gather(1, tok))
    # Different seeds or positions give different noise.
    assert not torch.equal(full[0], full[5])  # position equal, seed differs
    assert not torch.equal(gumbel_noise_ref(seeds[:1], positions[:1] + 1, 1000)[0], full[0])


def test_reference_is_standard_gumbel() -> None:
    seeds = torch.arange(64, dtype=torch.int64)
    g = gumbel_noise_ref(seeds, torch.zeros(64, dtype=torch.int64), 4096)
    assert abs(g.mean().item() - 0.5772156649) < 0.01  # Euler-Mascheroni constant
    assert abs(g.std().item() - math.pi / math.sqrt(6)) < 0.01
    assert torch.isfinite(g).all()


def test_gumbel_max_draws_from_softmax() -> None:
    # argmax(logits + g) over many seeds follows softmax(logits).
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    n = 20000
    seeds = torch.arange(n, dtype=torch.int64)
    g = gumbel_noise_ref(seeds, torch.full((n,), 3, dtype=torch.int64), 4)
    counts = torch.bincount((logits + g).argmax(dim=1), minlength=4).float() / n
    torch.testing.assert_close(counts, torch.softmax(logits, 0), atol=0.015, rtol=0)


def test_bad_dtypes_are_rejected() -> None:
    with pytest.raises(ValueError, match="int64"):
        gumbel_noise_ref(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="equal 1-D"):
        gumbel_noise_ref(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 8)
