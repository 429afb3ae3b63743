"""Per-request recurrent state beside the paged KV cache: the caches of models with Mamba layers.

A Mamba layer keeps, per request, the last ``d_conv - 1`` inputs of its causal conv1d and its
SSM state; neither grows with the sequence, so they live in *slots* (one per running request,
``max_num_seqs`` of them), not in KV blocks. :class:`HybridCacheSpec` declares the cache of
every layer of such a model: attention layers (Jamba's) get a paged ``[2, num_blocks,
block_size, num_kv_heads, head_dim]`` tensor as any decoder, Mamba layers a :class:`MambaState`.

Layouts (vLLM's ``MambaSpec``, ``vllm/v1/kv_cache_interface.py``; the kernels' contract in
``kernels/causal_conv1d.py`` and ``kernels/selective_scan.py``):

- ``conv``: ``[num_slots, d_inner, d_conv - 1]`` in the model dtype, oldest input first;
- ``ssm``: ``[num_slots, d_inner, d_state]`` float32.

A slot's contents are never read before a request writes them: a request whose first scheduled
token is at position 0 (new, or recomputed after preemption) starts from zero state, whatever
the slot held (``has_initial_state`` in :class:`MambaStepInputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model.kv_cache import FullAttentionSpec, KVCacheSpec


@dataclass
class MambaState:
    """One Mamba layer's state cache (see the module docstring for the shapes)."""

    conv: torch.Tensor
    ssm: torch.Tensor


@dataclass(frozen=True)
class HybridCacheSpec(KVCacheSpec):
    """Caches of a model with Mamba layers, and attention layers where it has them.

    Attributes:
        layer_kinds: ``"attention"`` or ``"mamba"`` per layer (``num_layers`` of them).
        attention: the paged cache of one attention layer (unused without attention layers).
        d_inner, d_conv, d_state: the Mamba mixer's channels, conv width and state size.
    """

    layer_kinds: tuple[str, ...]
    attention: FullAttentionSpec
    d_inner: int
    d_conv: int
    d_state: int

    @property
    def num_attention_layers(self) -> int:
        return self.layer_kinds.count("attention")

    @property
    def values_per_token(self) -> int:
        return self.attention.values_per_token

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one KV block takes over the attention layers only (0 for Mamba)."""
        element = torch.empty((), dtype=dtype).element_size()
        return self.values_per_token * block_size * self.num_attention_layers * element

    def state_bytes_per_slot(self, dtype: torch.dtype) -> int:
        """Bytes one request's state takes over all Mamba layers (conv in ``dtype``, SSM fp32)."""
        element = torch.empty((), dtype=dtype).element_size()
        per_layer = self.d_inner * (self.d_conv - 1) * element + self.d_inner * self.d_state * 4
        return per_layer * self.layer_kinds.count("mamba")

    def layer_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return self.attention.layer_shape(num_blocks, block_size)

    def allocate(
        self,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> list[torch.Tensor | MambaState]:
        """Zeroed caches of every layer, in layer order.

        Raises:
            ValueError: ``num_slots < 1`` (each running request needs a slot).
        """
        if num_slots < 1:
            raise ValueError(f"a model with Mamba layers needs num_slots >= 1, got {num_slots}")
        caches: list[torch.Tensor | MambaState] = []
        for kind in self.layer_kinds:
            if kind == "attention":
                caches.append(
                    torch.zeros(
                        self.layer_shape(num_blocks, block_size), dtype=dtype, device=device
                    )
                )
            else:
                caches.append(
                    MambaState(
                        conv=torch.zeros(
                            num_slots, self.d_inner, self.d_conv - 1, dtype=dtype, device=device
                        ),
                        ssm=torch.zeros(
                            num_slots,
                            self.d_inner,
                            self.d_state,
                            dtype=torch.float32,
                            device=device,
                        ),
                    )
                )
        return caches


@dataclass(frozen=True)
class MambaStepInputs:
    """What the Mamba layers read of a step, derived once per forward.

    Attributes:
        query_start_loc: ``[num_reqs + 1] int32`` (the attention metadata's).
        state_indices: ``[num_reqs] int32`` slot of each request's state.
        has_initial_state: ``[num_reqs] bool``: the request continues from its stored state
            (a later prefill chunk, or decode) rather than from zero.
        is_decode: every request has one token this step and continues from its state (host
            bool, picks the one-token decode kernels).
    """

    query_start_loc: torch.Tensor
    state_indices: torch.Tensor
    has_initial_state: torch.Tensor
    is_decode: bool

    @classmethod
    def of(cls, md: AttentionMetadata, positions: torch.Tensor) -> MambaStepInputs:
        """From the step's metadata and positions: a request continues from its state when its
        first token this step is not at position 0 (computed on the device: no host sync).

        Raises:
            ValueError: the metadata has no ``state_indices`` (the runner gave no slots).
        """
        if md.state_indices is None:
            raise ValueError("a model with Mamba layers needs AttentionMetadata.state_indices")
        starts = md.query_start_loc[:-1].long()
        return cls(
            query_start_loc=md.query_start_loc,
            state_indices=md.state_indices,
            has_initial_state=positions.index_select(0, starts) > 0,
            is_decode=md.max_query_len == 1 and md.all_states_continue,
        )


__all__ = ["HybridCacheSpec", "MambaState", "MambaStepInputs"]
