"""The sparse mixture-of-experts block: a router, routed experts through the fused MoE kernel,
and optional shared experts. Plain PyTorch around ``kernels.fused_moe``.

``SparseMoeBlock(hidden_size, moe, backend)`` serves Qwen2-MoE, Qwen3-MoE, GraniteMoe and
DeepSeek-V2's MoE layers; what differs between them is data in :class:`MoEConfig` (routing
rule, shared experts, router precision). Numerics follow transformers' modeling files
(``Qwen2MoeSparseMoeBlock``, ``Qwen3MoeSparseMoeBlock``, ``GraniteMoeMoE``) and DeepSeek's own
``modeling_deepseek.py`` (``MoEGate``, ``DeepseekV2MoE``):

- router logits ``x @ gate^T`` in the model dtype (DeepSeek: in float32), softmax in float32;
- top-k over the probabilities; renormalised to sum 1 where the family says so; scaled by
  DeepSeek's ``routed_scaling_factor`` where its gate does; the weights stay float32 (vLLM's
  convention; transformers rounds them to the model dtype first, which differs at bf16 only);
- routed output ``sum_j w_j * down_e(silu(gate_e(x)) * up_e(x))`` (``kernels.fused_moe``);
- plus the shared expert's output, times ``sigmoid(x @ shared_expert_gate^T)`` for Qwen2-MoE.

Parameters (the loader fills them from the HF names, ``engine.model.moe_weights``):
``gate.weight [E, H]``, ``experts.w13 [E, 2I, H]`` (``[gate; up]`` per expert),
``experts.w2 [E, H, I]``, ``shared_expert.gate_up_proj.weight [2S, H]``,
``shared_expert.down_proj.weight [H, S]``, ``shared_expert_gate.weight [1, H]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from turnout.engine.model.layers import GatedMLP
from turnout.engine.model.moe_config import MOE_FAMILIES, SCORING_FUNCS, TOPK_METHODS, MoEConfig
from turnout.kernels import fused_moe as fm
from turnout.kernels._triton import HAS_TRITON

MOE_BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


def select_experts(
    router_logits: torch.Tensor,  # [T, E], any float dtype
    *,
    top_k: int,
    renormalize: bool,
    scoring: str = "softmax",
    topk_method: str = "greedy",
    n_group: int | None = None,
    topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # topk_weights [T, k] float32, topk_ids [T, k] int32
    """Route each token to ``top_k`` experts.

    ``scores = softmax(router_logits.float())``; ``group_limited_greedy`` (DeepSeek-V2) first
    keeps the ``topk_group`` of ``n_group`` equal groups of experts with the highest best
    score and zeroes the others' scores; then the ``top_k`` highest scores (sorted, highest
    first), divided by their sum when ``renormalize``, times ``routed_scaling_factor``.
    No host synchronisation.

    Raises:
        ValueError: an unknown ``scoring`` / ``topk_method``, ``top_k`` outside ``[1, E]``, or
            groups that do not divide the experts (named in the message).
    """
    if router_logits.dim() != 2 or not router_logits.is_floating_point():
        raise ValueError(
            f"router_logits must be a [T, E] float tensor, got "
            f"{tuple(router_logits.shape)} {router_logits.dtype}"
        )
    num_experts = router_logits.shape[1]
    if scoring not in SCORING_FUNCS:
        raise ValueError(
            f"scoring {scoring!r} is not implemented; supported: {', '.join(SCORING_FUNCS)}"
        )
    if topk_method not in TOPK_METHODS:
        raise ValueError(
            f"topk_method {topk_method!r} is not implemented; supported: {', '.join(TOPK_METHODS)}"
        )
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    scores = router_logits.float().softmax(dim=-1)
    if topk_method == "group_limited_greedy":
        scores = _keep_top_groups(scores, top_k, n_group, topk_group)
    topk_weights, topk_ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        topk_weights = topk_weights * routed_scaling_factor
    return topk_weights.contiguous(), topk_ids.to(torch.int32)


def _keep_top_groups(
    scores: torch.Tensor, top_k: int, n_group: int | None, topk_group: int | None
) -> torch.Tensor:
    num_tokens, num_experts = scores.shape
    if not n_group or not topk_group or num_experts % n_group or not 0 < topk_group <= n_group:
        raise ValueError(
            f"group_limited_greedy needs n_group dividing the {num_experts} experts and "
            f"topk_group in [1, n_group], got n_group={n_group}, topk_group={topk_group}"
        )
    per_group = num_experts // n_group
    if top_k > topk_group * per_group:
        raise ValueError(
            f"top_k ({top_k}) exceeds the {topk_group * per_group} experts of {topk_group} groups"
        )
    grouped = scores.view(num_tokens, n_group, per_group)
    best_groups = grouped.max(dim=-1).values.topk(topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros(num_tokens, n_group, dtype=torch.bool, device=scores.device)
    keep.scatter_(1, best_groups, True)
    return grouped.masked_fill(~keep[:, :, None], 0.0).view(num_tokens, num_experts)


class FusedExperts(nn.Module):
    """The routed experts' weights, stacked: ``w13 [E, 2I, H]`` (``[gate; up]``) and
    ``w2 [E, H, I]``."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w13 = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.w2 = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False
        )


class SparseMoeBlock(nn.Module):
    """Router + routed experts + shared experts of one MoE layer.

    Args:
        hidden_size: the model's hidden size ``H``.
        moe: the layer's :class:`MoEConfig`.
        backend: ``"auto"`` (the Triton kernel for CUDA tensors, the torch reference for CPU
            tensors, as ``engine.model.attention``), ``"triton"`` (on CPU through
            ``TRITON_INTERPRET=1``) or ``"torch"``.

    Raises:
        ValueError: an unknown ``backend``.
    """

    def __init__(self, hidden_size: int, moe: MoEConfig, backend: str = "auto") -> None:
        super().__init__()
        if backend not in MOE_BACKENDS:
            raise ValueError(f"backend must be one of {MOE_BACKENDS}, got {backend!r}")
        self.moe = moe
        self.backend = backend
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = FusedExperts(moe.num_experts, hidden_size, moe.moe_intermediate_size)
        self.shared_expert = (
            GatedMLP(hidden_size, moe.shared_expert_intermediate_size)
            if moe.shared_expert_intermediate_size
            else None
        )
        self.shared_expert_gate = (
            nn.Linear(hidden_size, 1, bias=False) if moe.shared_expert_gate else None
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H], hidden's dtype
        topk_weights, topk_ids = select_experts(
            self.router_logits(hidden),
            top_k=self.moe.num_experts_per_tok,
            renormalize=self.moe.renormalize,
            scoring=self.moe.scoring_func,
            topk_method=self.moe.topk_method,
            n_group=self.moe.n_group,
            topk_group=self.moe.topk_group,
            routed_scaling_factor=self.moe.routing_scale,
        )
        experts = fm.fused_experts if self._use_triton(hidden.device) else fm.fused_experts_ref
        out = experts(hidden, self.experts.w13, self.experts.w2, topk_weights, topk_ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(hidden)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(hidden)) * shared
            out = out + shared
        return out

    def router_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, E]
        """``hidden @ gate^T``: in the model dtype, or in float32 where the family's router
        computes there (DeepSeek)."""
        if self.moe.router_in_float32:
            return F.linear(hidden.float(), self.gate.weight.float())
        logits: torch.Tensor = self.gate(hidden)
        return logits

    def _use_triton(self, device: torch.device) -> bool:
        if self.backend == "auto":
            return device.type == "cuda" and HAS_TRITON
        return self.backend == "triton"


__all__ = [
    "MOE_BACKENDS",
    "MOE_FAMILIES",
    "FusedExperts",
    "MoEConfig",
    "SparseMoeBlock",
    "select_experts",
]
