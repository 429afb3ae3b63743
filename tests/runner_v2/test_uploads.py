"""runner_v2.uploads.to_device: one packed transfer, every array back with its dtype, shape and
values, and every view starting on a 16-byte boundary (Triton specialises pointers on it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runner_v2.uploads import ALIGN_WORDS, to_device


@pytest.mark.parametrize("seed", range(20))
def test_arrays_come_back_equal_and_16_byte_aligned(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = []
    for _ in range(int(rng.integers(1, 9))):
        dtype = [np.int32, np.int64][int(rng.integers(2))]
        shape = (int(rng.integers(0, 7)),) if rng.random() < 0.7 else (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        arrays.append(rng.integers(-(2**31), 2**31 - 1, size=shape).astype(dtype))
    out = to_device(arrays, torch.device("cpu"))
    base = out[0].untyped_storage().data_ptr()
    for arr, t in zip(arrays, out, strict=True):
        assert t.dtype == {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}[arr.dtype]
        assert tuple(t.shape) == arr.shape
        np.testing.assert_array_equal(t.numpy(), arr)
        assert (t.data_ptr() - base) % (4 * ALIGN_WORDS) == 0  # its offset in the one buffer


def test_an_empty_list_is_an_empty_transfer() -> None:
    assert to_device([], torch.device("cpu")) == []
