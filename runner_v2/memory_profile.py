"""Memory profiling before the KV cache is sized (MRV2 and vLLM's V1 worker do the same:
vllm/v1/worker/gpu_worker.py ``determine_available_memory`` runs ``profile_run`` first).

The profile is one forward of the largest step the scheduler can send (``max_num_batched_tokens``
tokens over ``max_num_seqs`` requests, at most ``max_model_len`` tokens each), over a KV cache of one block per layer (every dummy
request reads block 0; no slot is written), then the LM head over ``max_num_seqs`` rows and a
float32 copy of those logits (the sampler's working copy). Its peak above what was allocated
before is the activation memory a step needs. The mixed-step graphs' shared pool holds about one
such forward for good, so runner_v2 reserves the peak twice when it captures them.
"""

from __future__ import annotations

from typing import Any

import torch

from turnout.engine.config import EngineConfig
from turnout.engine.cuda_graphs import buffers_forward, set_dummy_mixed_inputs
from turnout.engine.model.kv_cache import allocate_kv_caches

#: Fraction of the memory left after the reserve that the KV cache may take.
KV_FRACTION_AFTER_PROFILE = 0.9


def profile_peak_bytes(
    model: Any, buffers: Any, config: EngineConfig, dtype: torch.dtype, device: torch.device
) -> int:
    """Peak bytes allocated above the current level by the largest step's forward, LM head and
    logits copy (0 off CUDA, where it still runs the forward once as a check).

    Raises:
        torch.cuda.OutOfMemoryError: the largest step does not fit beside the weights.
    """
    num_reqs = config.max_num_seqs
    # The largest step: the token budget, or every request at max_model_len tokens when that
    # is less (more keys than max_model_len would read past a dummy request's block-table row).
    num_tokens = min(max(config.max_num_batched_tokens, num_reqs), num_reqs * config.max_model_len)
    caches = list(allocate_kv_caches(model.kv_cache_spec, 1, config.block_size, dtype, device))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        set_dummy_mixed_inputs(buffers, num_reqs, num_tokens)
        hidden = buffers_forward(
            model,
            buffers,
            caches,
            num_reqs,
            num_tokens,
            min(num_tokens, config.max_model_len),
            max_model_len=config.max_model_len,
            block_size=config.block_size,
        )
        logits = model.compute_logits(hidden[:num_reqs])
        scratch = logits.clone()
    if not cuda:
        return 0
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del hidden, logits, scratch, caches
    torch.cuda.empty_cache()
    return int(peak)


def kv_budget_after_profile(free_bytes: int, peak_bytes: int, graph_pool: bool) -> int:
    """KV-cache bytes: :data:`KV_FRACTION_AFTER_PROFILE` of the free memory left once the step's
    peak (twice, with mixed-step graphs) is set aside; never negative."""
    reserve = peak_bytes * (2 if graph_pool else 1)
    return max(0, int((free_bytes - reserve) * KV_FRACTION_AFTER_PROFILE))


__all__ = ["KV_FRACTION_AFTER_PROFILE", "kv_budget_after_profile", "profile_peak_bytes"]
