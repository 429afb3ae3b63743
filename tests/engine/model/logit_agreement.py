"""The agreement of two paths' logits where both are rounded to a 16-bit dtype (test helper).

``assert_logits_agree(got, want, what, min_cos)``: every row's cosine is at least ``min_cos``;
every row's relative error, ``|got - want| / |want|`` after taking out each row's mean, is at
most ``sqrt(1 / min_cos**2 - 1)``; and wherever the top-1 choices differ the two candidates are
tied within what the comparison can resolve: ``want``'s gap between its best token and
``got``'s pick is at most ``max(4 x the row's RMS difference, two ulps of want's best logit in
the logits' dtype)``.

Why the relative error: a cosine ignores a scale (logits doubled, a temperature applied twice,
keep every cosine at 1 and every argmax), and a row's common offset inflates it (flat logits
against logits of mean 20 and spread 1.2 have a cosine of 0.998). Errors independent of the
logits at cosine ``c`` are ``sqrt(1 / c**2 - 1)`` of them; the bound is that at ``min_cos``.
Why without the row's mean: softmax ignores a per-row constant, so it is no disagreement, and
counted as noise it widened the near-tie allowance (a shift of 0.45 let every row pick its
second-best token).

Why two ulps: both paths round each logit to the dtype on its own (half an ulp each way). If
``got`` ranks the pick at or above the best after rounding and ``want`` puts them ``g`` apart,
the unrounded differences of the two paths at those two tokens need only sum to ``g - 2`` ulps:
a gap of two ulps can flip with any difference at all before rounding. A fraction-of-rows
threshold is not used: random weights make many rows near ties, and in a 23-token prompt one
flip moves the fraction by 4 %.
"""

from __future__ import annotations

import torch


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at ``|values|`` (float32 result): ``2 ** (exponent - mantissa bits)``."""
    info = torch.finfo(dtype)
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    exponent = torch.floor(torch.log2(values.float().abs().clamp_min(info.tiny)))
    return torch.exp2(exponent - mantissa_bits)


def assert_logits_agree(
    got: torch.Tensor,
    want: torch.Tensor,
    what: str,
    *,
    min_cos: float,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Assert the module docstring's agreement of ``[rows, vocab]`` logits.

    Raises:
        AssertionError: the shapes differ, a row's cosine is below ``min_cos`` or its
            relative error above the bound, or a top-1 choice differs by more than a near tie
            (the message lists the rows' gaps and allowances).
    """
    assert got.shape == want.shape, f"{what}: shapes {tuple(got.shape)} and {tuple(want.shape)}"
    got, want = got.float(), want.float()
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1).min().item()
    assert cos >= min_cos, f"{what}: min row cosine {cos} < {min_cos}"
    diff = (got - got.mean(-1, keepdim=True)) - (want - want.mean(-1, keepdim=True))
    spread = (want - want.mean(-1, keepdim=True)).norm(dim=-1)
    rel = (diff.norm(dim=-1) / spread.clamp_min(torch.finfo(torch.float32).tiny)).max().item()
    max_rel = (1 / min_cos**2 - 1) ** 0.5
    assert rel <= max_rel, f"{what}: max row relative error {rel} > {max_rel} (cosine {min_cos})"
    pick = got.argmax(-1)
    best = want.max(-1).values
    differ = pick != want.argmax(-1)
    gap = best - want.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
    noise = diff.pow(2).mean(-1).sqrt()
    allowed = torch.maximum(4 * noise, 2 * ulp(best, dtype))
    assert bool((gap[differ] <= allowed[differ]).all()), (
        f"{what}: top-1 differs beyond a near tie: gaps {gap[differ].tolist()}, "
        f"allowed {allowed[differ].tolist()} ({int(differ.sum())} of {differ.numel()} rows differ)"
    )
