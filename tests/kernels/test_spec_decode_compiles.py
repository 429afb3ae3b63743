"""The speculative-decoding kernels (rejection sampling, processed probabilities, GPU n-gram
proposals, the speculative post-update) compile for sm_90 with Triton's bundled ptxas (no GPU
needed): the interpreter the CPU suite uses accepts code the compiler rejects."""

from __future__ import annotations

from pathlib import Path

import pytest
from sm90_compile import run_script

triton = pytest.importorskip("triton")
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@pytest.mark.skipif(not (BIN / "ptxas").exists(), reason="this Triton build ships no ptxas")
def test_spec_decode_kernels_compile_for_sm90() -> None:
    out = run_script("compile_spec_decode.py")
    assert out.returncode == 0, out.stderr[-4000:]
    names = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("compiled")]
    # probabilities: with and without penalty counts; rejection: 3 k x (greedy only, one-hot
    # drafts, draft probabilities); n-gram and post-update: one per k.
    assert names.count("_compute_probs_kernel") == 2, out.stdout
    assert names.count("_rejection_sample_kernel") == 9, out.stdout
    assert names.count("_ngram_propose_kernel") == 3, out.stdout
    assert names.count("_post_update_spec_kernel") == 3, out.stdout  # OUT_BLOCK 2, 4 and 8
