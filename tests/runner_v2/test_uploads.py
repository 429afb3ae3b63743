"""runner_v2.uploads.to_device: one packed transfer, every array back with its dtype, shape and
values, and every view starting on a 16-byte boundary (Triton specialises pointers on it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turnout.runner_v2.uploads import ALIGN_WORDS, to_device


@pytest.mark.parametrize("seed", range(20))
def test_arrays_come_back_equal_and_16_byte_aligned(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = []
    for _ in range(int(rng.integers(1, 9))):
        dtype = [np.int32, np.int64][int(rng.integers(2))]
        shape = (
            (int(rng.integers(0, 7)),)
            if rng.random() < 0.7
            else (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        )
        arrays.append(rng.integers(-(2**31), 2**31 - 1, size=shape).astype(dtype))
    out = to_device(arrays, torch.device("cpu"))
    base = out[0].untyped_storage().data_ptr()
    for arr, t in zip(arrays, out, strict=True):
        assert (
            t.dtype == {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}[arr.dtype]
        )
        assert tuple(t.shape) == arr.shape
        np.testing.assert_array_equal(t.numpy(), arr)
        assert (t.data_ptr() - base) % (4 * ALIGN_WORDS) == 0  # its offset in the one buffer


def test_an_empty_list_is_an_empty_transfer() -> None:
    assert to_device([], torch.device("cpu")) == []


def test_empty_arrays_alone_come_back_empty() -> None:
    # torch.from_numpy gives an empty buffer stride 0, which an int64 view refused.
    arrays = [np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros((0, 3), np.int64)]
    out = to_device(arrays, torch.device("cpu"))
    assert [(t.dtype, tuple(t.shape)) for t in out] == [
        (torch.int32, (0,)),
        (torch.int64, (0,)),
        (torch.int64, (0, 3)),
    ]


def test_float_and_0_d_arrays_keep_their_dtype_and_shape() -> None:
    arrays = [
        np.arange(3, dtype=np.float32),
        np.array(7, np.int64),
        np.arange(3, dtype=np.int32),
        np.linspace(0, 1, 4).reshape(2, 2),
    ]
    out = to_device(arrays, torch.device("cpu"))
    for arr, t in zip(arrays, out, strict=True):
        assert t.dtype == torch.from_numpy(arr).dtype and tuple(t.shape) == arr.shape
        np.testing.assert_array_equal(t.numpy(), arr)


@pytest.mark.parametrize("dtype", [np.bool_, np.int16, np.uint32, np.uint64, np.dtype(">i4")])
def test_a_dtype_it_cannot_view_back_is_refused(dtype: np.dtype) -> None:
    # Packed as int32 words, these came back reinterpreted (four bools as one int32, uint64 as float64).
    with pytest.raises(TypeError, match="to_device takes"):
        to_device([np.arange(3, dtype=np.int32), np.ones(4, dtype=dtype)], torch.device("cpu"))
