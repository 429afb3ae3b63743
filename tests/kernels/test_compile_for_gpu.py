"""Every runner_v2 kernel compiles for sm_90 (H100/H200), checked without a GPU.

The CPU suite runs the kernels through Triton's interpreter, which accepts code the compiler
rejects; this compiles each launched kernel variant with Triton's bundled ptxas instead.
"""

from __future__ import annotations

import pytest
from sm90_compile import has_ptxas, run_script

triton = pytest.importorskip("triton")

EXPECTED = {
    "_apply_staged_writes_kernel",
    "_build_penalty_counts_kernel",
    "_compute_logits_indices_kernel",
    "_compute_slot_mapping_kernel",
    "_gumbel_reduce_kernel",
    "_gumbel_sample_kernel",
    "_post_update_kernel",
    "_prepare_input_ids_kernel",
    "_prepare_positions_kernel",
    "_prepare_query_start_loc_kernel",
    "_qk_norm_rope_kernel",
    "_rms_norm_kernel",
    "_silu_and_mul_kernel",
    "_topk_logprobs_kernel",
}


@pytest.mark.skipif(not has_ptxas(), reason="this Triton build ships no ptxas")
def test_all_kernels_compile_for_sm90() -> None:
    out = run_script("compile_for_gpu.py")
    assert out.returncode == 0, out.stderr[-4000:]
    compiled = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("compiled ")}
    assert compiled >= EXPECTED, f"not compiled: {sorted(EXPECTED - compiled)}"
