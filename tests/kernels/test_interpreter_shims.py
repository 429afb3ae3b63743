"""The suite's shims of Triton's interpreter (tests/conftest.py) answer as Triton does: the
dtype table built once maps every language dtype, block and pointer as Triton's own
``_get_np_dtype`` does. Only under the interpreter, on the Triton release the shims were read
against (3.9); elsewhere Triton runs as shipped and there is nothing to compare."""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" or not triton.__version__.startswith("3.9."):
    pytest.skip("the shims apply to Triton 3.9's interpreter only", allow_module_level=True)

import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

SCALARS = [
    tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16,
    tl.int32, tl.uint32, tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e5b16,
    tl.float8e4nv, tl.float8e4b8, tl.float8e4b15,
]  # fmt: skip


def test_the_dtype_table_answers_as_triton_does() -> None:
    shim = interpreter._get_np_dtype
    shipped = shim.__wrapped__  # Triton's own function, kept by the shim
    cases = [
        *SCALARS,
        *(tl.block_type(d, [4, 2]) for d in SCALARS),
        *(tl.pointer_type(d) for d in SCALARS),
        *(tl.block_type(tl.pointer_type(d), [8]) for d in SCALARS),
    ]
    for dtype in cases:
        assert shim(dtype) == shipped(dtype), dtype


def test_an_unknown_dtype_still_fails_as_it_did() -> None:
    shipped = interpreter._get_np_dtype.__wrapped__
    for fn in (interpreter._get_np_dtype, shipped):
        with pytest.raises(KeyError):
            fn(tl.void)
