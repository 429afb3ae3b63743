"""Triton import point for every kernel module.

On a machine without a GPU it selects Triton's interpreter (``TRITON_INTERPRET=1``) before
Triton is imported, unless the variable is set: kernels then run on CPU tensors (slowly).

Kernel modules import ``triton`` and ``tl`` from here so that the torch references (and
runner_v1, which uses only those) still import on machines without Triton. Without Triton the
``@triton.jit`` functions stay plain Python functions and every launcher raises
:class:`TritonUnavailableError` before touching them.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


# Without a GPU, Triton can launch kernels only through its interpreter, and it decides that
# when `triton` is first imported: choose it here, before the import (tests/conftest.py too).
# A process that imported Triton already keeps its choice (e.g. compiling for sm_90 on a CPU).
if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not _has_cuda():
    os.environ["TRITON_INTERPRET"] = "1"

#: True when this process runs Triton kernels through the interpreter (on the CPU).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")

try:  # pragma: no cover - exercised by whichever environment runs the suite
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False

    class _JitStub:
        """Stands in for ``triton`` so that ``@triton.jit`` definitions still import."""

        @staticmethod
        def jit(fn: Any = None, **_: Any) -> Any:
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(0, (n - 1).bit_length())

    class _LanguageStub:
        constexpr = Any

    triton = _JitStub()
    tl = _LanguageStub()


class TritonUnavailableError(RuntimeError):
    """Raised by a launcher when Triton is not installed (use the ``*_ref`` function instead)."""


def require_triton() -> None:
    """Raise :class:`TritonUnavailableError` when Triton cannot be imported."""
    if not HAS_TRITON:
        raise TritonUnavailableError(
            "Triton is not installed: install `triton` (CPU runs need TRITON_INTERPRET=1) "
            "or use runner_v1, which needs no Triton"
        )


__all__ = ["HAS_TRITON", "INTERPRETED", "TritonUnavailableError", "require_triton", "tl", "triton"]
