"""Mamba-1 (``MambaForCausalLM``; Gu & Dao 2023, arXiv:2312.00752) over packed tokens, with its
per-request state in slots (``engine.model.state_cache``) instead of a KV cache.

Each layer is ``x + mixer(RMSNorm(x))``; the mixer (:class:`MambaMixer`, HF
``MambaMixer.slow_forward`` of transformers 5.24 is the math matched) projects to ``x, z``, runs
a causal depthwise conv1d and SiLU on ``x``, derives the input-dependent ``dt, B, C``, runs the
selective scan and gates with ``SiLU(z)``. The conv1d and the scan read and update each
request's state slot in place (``kernels/causal_conv1d.py``, ``kernels/selective_scan.py``):
a prompt split into chunks over several steps carries its state from chunk to chunk.

Parameter names are HF's (``backbone.embeddings``, ``backbone.layers.{i}.mixer.*``,
``backbone.norm_f``); the LM head is tied to the embeddings unless the config says otherwise.
The mixer is shared with Jamba (``engine.model.jamba``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.config import ModelConfig
from turnout.engine.model.kv_cache import FullAttentionSpec
from turnout.engine.model.layers import RMSNorm
from turnout.engine.model.llama import DecoderModel
from turnout.engine.model.mamba_config import MambaConfig
from turnout.engine.model.state_cache import HybridCacheSpec, MambaState, MambaStepInputs
from turnout.kernels import causal_conv1d as conv
from turnout.kernels import selective_scan as scan
from turnout.kernels._triton import HAS_TRITON


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend == "auto":
        return device.type == "cuda" and HAS_TRITON
    return backend == "triton"


class MambaMixer(nn.Module):
    """One Mamba-1 mixer over packed tokens ``[T, hidden] -> [T, hidden]``.

    Args:
        hidden_size: the residual stream's width.
        m: the mixer's facts; ``m.inner_layernorms`` adds Jamba's RMSNorms on dt, B and C.
        eps: their epsilon.
        backend: ``"auto"`` (Triton on CUDA, torch references on CPU), ``"triton"`` or ``"torch"``.
    """

    def __init__(self, hidden_size: int, m: MambaConfig, eps: float, backend: str) -> None:
        super().__init__()
        self.m, self.backend = m, backend
        self.in_proj = nn.Linear(hidden_size, 2 * m.d_inner, bias=m.proj_bias)
        self.conv1d = nn.Conv1d(m.d_inner, m.d_inner, m.d_conv, groups=m.d_inner, bias=m.conv_bias)
        self.x_proj = nn.Linear(m.d_inner, m.dt_rank + 2 * m.d_state, bias=False)
        self.dt_proj = nn.Linear(m.dt_rank, m.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(m.d_inner, m.d_state), requires_grad=False)
        self.D = nn.Parameter(torch.empty(m.d_inner), requires_grad=False)
        self.out_proj = nn.Linear(m.d_inner, hidden_size, bias=m.proj_bias)
        if m.inner_layernorms:
            self.dt_layernorm = RMSNorm(m.dt_rank, eps)
            self.b_layernorm = RMSNorm(m.d_state, eps)
            self.c_layernorm = RMSNorm(m.d_state, eps)

    def forward(
        self, hidden: torch.Tensor, state: MambaState, step: MambaStepInputs
    ) -> torch.Tensor:
        m = self.m
        x, z = self.in_proj(hidden).chunk(2, dim=-1)
        x = self._conv(x.contiguous(), state, step)
        dt, b, c = self.x_proj(x).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
        if m.inner_layernorms:
            dt, b, c = self.dt_layernorm(dt), self.b_layernorm(b), self.c_layernorm(c)
        dt = dt @ self.dt_proj.weight.t()  # the bias is added in the scan, before softplus
        a = -torch.exp(self.A_log.float())
        y = self._scan(
            x, dt.contiguous(), a, b.contiguous(), c.contiguous(), z.contiguous(), state, step
        )
        out: torch.Tensor = self.out_proj(y)
        return out

    def _conv(self, x: torch.Tensor, state: MambaState, step: MambaStepInputs) -> torch.Tensor:
        weight, triton = self.conv1d.weight.squeeze(1), _use_triton(self.backend, x.device)
        if step.is_decode:
            update = conv.causal_conv1d_update if triton else conv.causal_conv1d_update_ref
            return update(x, weight, self.conv1d.bias, state.conv, step.state_indices, "silu")
        run = conv.causal_conv1d if triton else conv.causal_conv1d_ref
        return run(
            x,
            weight,
            self.conv1d.bias,
            state.conv,
            step.query_start_loc,
            step.state_indices,
            step.has_initial_state,
            "silu",
        )

    def _scan(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        z: torch.Tensor,
        state: MambaState,
        step: MambaStepInputs,
    ) -> torch.Tensor:
        triton, d, dt_bias = (
            _use_triton(self.backend, x.device),
            self.D.float(),
            self.dt_proj.bias.float(),
        )
        if step.is_decode:
            update = scan.selective_state_update if triton else scan.selective_state_update_ref
            return update(x, dt, a, b, c, d, z, dt_bias, state.ssm, step.state_indices, True)
        run = scan.selective_scan if triton else scan.selective_scan_ref
        return run(
            x,
            dt,
            a,
            b,
            c,
            d,
            z,
            dt_bias,
            state.ssm,
            step.query_start_loc,
            step.state_indices,
            step.has_initial_state,
            True,
        )


class MambaBlock(nn.Module):
    """HF ``MambaBlock``: ``residual + mixer(norm(x))``, the residual in float32 when the config
    says ``residual_in_fp32`` (the stream between layers is then float32)."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        assert config.mamba is not None
        # torch's RMSNorm, not the fused kernel: with the kernel, the bf16 parity test at
        # Mamba-130m's real size (greedy tokens equal to HF's, exactly) failed on the H200;
        # the fused kernels serve the attention decoders (docs/model-layer.md)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, fused=False)
        self.mixer = MambaMixer(config.hidden_size, config.mamba, config.rms_norm_eps, backend)
        self.residual_in_fp32 = config.mamba.residual_in_fp32

    def forward(
        self, hidden: torch.Tensor, state: MambaState, step: MambaStepInputs
    ) -> torch.Tensor:
        out: torch.Tensor = self.mixer(self.norm(hidden.to(self.norm.weight.dtype)), state, step)
        residual = hidden.float() if self.residual_in_fp32 else hidden
        return residual + out


class MambaBody(nn.Module):
    """HF's ``backbone.`` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            MambaBlock(config, backend) for _ in range(config.num_hidden_layers)
        )
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps, fused=False)


class MambaForCausalLM(DecoderModel):
    """Mamba-1 over per-request state slots (see the module docstring).

    ``forward`` takes the same arguments as every decoder; ``kv_caches`` holds one
    :class:`~engine.model.state_cache.MambaState` per layer and ``attn_metadata.state_indices``
    the slot of each request. ``positions`` only tell a request's first step (position 0:
    start from zero state) from a continuation.
    """

    fused_params: ClassVar[dict[str, tuple[str, ...]]] = {}
    lm_head: nn.Linear  # never sharded (parallel_layers covers the Llama family only)

    def __init__(self, config: ModelConfig, attn_backend: str = "auto") -> None:
        nn.Module.__init__(self)
        if config.mamba is None:
            raise ValueError(f"{config.architecture} has no Mamba config")
        self.config = config
        self.backbone = MambaBody(config, attn_backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    @property
    def model(self) -> nn.Module:
        """The body (``backbone``), under the name the other decoders use."""
        return self.backbone

    @classmethod
    def hf_weight_shapes(cls, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        m, h = config.mamba, config.hidden_size
        assert m is not None
        shapes: dict[str, tuple[int, ...]] = {
            "backbone.embeddings.weight": (config.vocab_size, h),
            "backbone.norm_f.weight": (h,),
        }
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (config.vocab_size, h)
        for n in range(config.num_hidden_layers):
            shapes[f"backbone.layers.{n}.norm.weight"] = (h,)
            shapes |= {
                f"backbone.layers.{n}.mixer.{k}": s for k, s in mixer_weight_shapes(h, m).items()
            }
        return shapes

    @classmethod
    def kv_cache_spec_for(cls, config: ModelConfig) -> HybridCacheSpec:
        m = config.mamba
        assert m is not None
        return HybridCacheSpec(
            num_layers=config.num_hidden_layers,
            layer_kinds=m.layer_kinds(config.num_hidden_layers),
            attention=FullAttentionSpec(num_layers=0, num_kv_heads=1, head_dim=1),
            d_inner=m.d_inner,
            d_conv=m.d_conv,
            d_state=m.d_state,
        )

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor | MambaState],  # type: ignore[override]
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size]
        """Run every layer over the step's packed tokens, updating each request's state slot.

        Raises:
            ValueError: not one :class:`MambaState` per layer, or no ``state_indices``.
        """
        layers = self.backbone.layers
        if len(kv_caches) != len(layers) or not all(isinstance(c, MambaState) for c in kv_caches):
            raise ValueError(
                f"expected {len(layers)} Mamba state caches, got {len(kv_caches)} caches"
            )
        step = MambaStepInputs.of(attn_metadata, positions)
        hidden = self.backbone.embeddings(input_ids)
        for layer, state in zip(layers, kv_caches, strict=True):
            hidden = layer(hidden, state, step)
        out: torch.Tensor = self.backbone.norm_f(hidden)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, vocab_size] float32
        """LM-head logits in float32 (the float32 residual stream cast to the head's dtype first,
        as transformers does)."""
        logits: torch.Tensor = self.lm_head(hidden.to(self.lm_head.weight.dtype))
        return logits.float()


def mixer_weight_shapes(hidden_size: int, m: MambaConfig) -> dict[str, tuple[int, ...]]:
    """HF names (under the mixer's prefix) and shapes of one Mamba mixer's tensors."""
    shapes: dict[str, tuple[int, ...]] = {
        "A_log": (m.d_inner, m.d_state),
        "D": (m.d_inner,),
        "conv1d.weight": (m.d_inner, 1, m.d_conv),
        "in_proj.weight": (2 * m.d_inner, hidden_size),
        "x_proj.weight": (m.dt_rank + 2 * m.d_state, m.d_inner),
        "dt_proj.weight": (m.d_inner, m.dt_rank),
        "dt_proj.bias": (m.d_inner,),
        "out_proj.weight": (hidden_size, m.d_inner),
    }
    if m.conv_bias:
        shapes["conv1d.bias"] = (m.d_inner,)
    if m.proj_bias:
        shapes |= {"in_proj.bias": (2 * m.d_inner,), "out_proj.bias": (hidden_size,)}
    if m.inner_layernorms:
        shapes |= {
            "dt_layernorm.weight": (m.dt_rank,),
            "b_layernorm.weight": (m.d_state,),
            "c_layernorm.weight": (m.d_state,),
        }
    return shapes


__all__ = ["MambaBlock", "MambaForCausalLM", "MambaMixer", "mixer_weight_shapes"]
