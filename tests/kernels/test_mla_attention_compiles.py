"""The MLA kernels (latent attention, split-decode merge, latent cache write) compile for sm_90
with Triton's bundled ptxas (no GPU needed): the interpreter the CPU suite uses accepts code the
compiler rejects. The script prints each variant's registers and spill bytes ("stack"): the
bf16 prefill tile (64 x 64) spills, and still ran fastest on an H200 (docs/model-layer.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sm90_compile import has_ptxas, run_script

triton = pytest.importorskip("triton")


@pytest.mark.skipif(not has_ptxas(), reason="this Triton build ships no ptxas")
def test_mla_kernels_compile_for_sm90() -> None:
    out = run_script("compile_mla_attention.py")
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("compiled")]
    names = [line.split()[1] for line in lines]
    assert names.count("_mla_attention_kernel") == 12
    assert "_mla_merge_splits_kernel" in names and "_concat_and_cache_mla_kernel" in names
    if (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        for line in lines:  # the resource report of every variant
            assert re.search(r"regs \d+, stack \d+$", line), line
