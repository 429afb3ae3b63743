"""The Mamba-1 kernels (causal conv1d, selective scan and their decode updates) compile for
sm_90 with Triton's bundled ptxas (no GPU needed): the interpreter the CPU suite uses accepts
code the compiler rejects. The script prints each variant's registers and spill bytes
("stack"), the numbers to tune the scan's tiles by without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sm90_compile import has_ptxas, run_script

triton = pytest.importorskip("triton")
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@pytest.mark.skipif(not has_ptxas(), reason="this Triton build ships no ptxas")
def test_mamba_kernels_compile_for_sm90() -> None:
    out = run_script("compile_mamba.py")
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("compiled")]
    names = [line.split()[1] for line in lines]
    # conv: bf16/fp32 x (bias, no bias, no activation); scan: bf16/fp32 x (all options, none)
    # plus three more bf16 tiles of the benchmark's sweep; the updates: dtype x 2 variants
    assert names.count("_causal_conv1d_kernel") == 6, out.stdout
    assert names.count("_causal_conv1d_update_kernel") == 4, out.stdout
    assert names.count("_selective_scan_kernel") == 7, out.stdout
    assert names.count("_selective_state_update_kernel") == 4, out.stdout
    if (BIN / "cuobjdump").exists():
        for line in lines:  # the resource report of every variant
            assert re.search(r"regs \d+, stack \d+$", line), line
