"""Tensor parallelism of the Llama-family decoder (Megatron-LM's layout, as vLLM's
``vllm/model_executor/layers/linear.py`` and ``vocab_parallel_embedding.py``), applied to a
plain :class:`~engine.model.llama.DecoderModel` from outside (gpt-fast's way): the model file
knows nothing of ranks.

:func:`shard_decoder` swaps, on the meta device before the weights are assigned:

- ``qkv_proj`` for a :class:`ColumnParallelLinear` holding this rank's query heads and its KV
  heads (``[q_r; k_r; v_r]``, each piece cut from its own HF tensor), ``gate_up_proj`` for one
  holding ``[gate_r; up_r]``: their outputs stay sharded, attention and SiLU·mul run on them;
- ``o_proj`` and ``down_proj`` for a :class:`RowParallelLinear`: the rank's input columns, a
  partial product, one ``all_reduce`` (the bias added once, after it);
- ``embed_tokens`` for a :class:`VocabParallelEmbedding` (rows ``[r·V/tp, (r+1)·V/tp)`` of the
  vocabulary padded to a multiple of ``tp``; out-of-shard ids give zeros; one ``all_reduce``)
  and ``lm_head`` for a :class:`ParallelLMHead` (the same rows; ``all_gather`` of the logit
  shards to the full vocabulary, the padding trimmed): every rank holds the full logits, so
  every rank samples the same tokens from them.

KV heads: with ``tp <= num_key_value_heads`` each rank keeps ``num_key_value_heads / tp`` of
them; with more ranks than KV heads each KV head is replicated on ``tp / num_key_value_heads``
ranks (vLLM's rule), one per rank. The paged cache of a rank holds its heads only
(``model.local_kv_cache_spec``).

Collectives go through :class:`TensorParallel` (``torch.distributed`` over its group: gloo on
CPU, NCCL on CUDA, where they are captured into CUDA graphs like any kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from turnout.engine.model.config import ModelConfig
from turnout.engine.model.kv_cache import FullAttentionSpec

if TYPE_CHECKING:
    from turnout.engine.model.llama import DecoderModel

# torch >= 2.13 names it all_gather_single (all_gather_into_tensor is deprecated there).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: Architectures whose model the layers below shard: the Llama family with plain attention.
TENSOR_PARALLEL_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group.

    Attributes:
        rank: ``0 <= rank < size``.
        size: ranks in the group (``tensor_parallel_size``).
        group: the ``torch.distributed`` process group of the collectives (``None``: the
            default group).
    """

    rank: int
    size: int
    group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, size * d]
        """The ranks' ``x`` side by side along the last dimension, rank order."""
        n, d = x.shape
        out = torch.empty((self.size * n, d), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous(), group=self.group)
        return out.view(self.size, n, d).transpose(0, 1).reshape(n, self.size * d)


def tensor_parallel_problem(config: ModelConfig, size: int) -> str | None:
    """Why ``config``'s model cannot run at ``tensor_parallel_size=size``, or None when it can."""
    if size == 1:
        return None
    flag = f"tensor_parallel_size={size}"
    if (
        config.architecture not in TENSOR_PARALLEL_ARCHITECTURES
        or config.quantization_method not in ("none", "gguf")
    ):
        what = (
            f"{config.architecture} (model_type {config.model_type or '?'})"
            if config.architecture not in TENSOR_PARALLEL_ARCHITECTURES
            else f"{config.quantization_method} weights of {config.architecture}"
        )
        return (
            f"{flag}: tensor parallelism is not implemented for {what}; it serves the Llama "
            f"family with plain attention ({', '.join(TENSOR_PARALLEL_ARCHITECTURES)}), "
            f"unquantised or GGUF: use tensor_parallel_size=1"
        )
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % size:
        return (
            f"{flag}: num_attention_heads ({heads}) of {config.architecture} is not divisible by it"
        )
    if kv % size and (size < kv or size % kv):
        return (
            f"{flag}: num_key_value_heads ({kv}) of {config.architecture} is neither divisible "
            f"by it nor a divisor of it (KV heads are split, or replicated when the ranks outnumber them)"
        )
    if config.intermediate_size % size:
        return f"{flag}: intermediate_size ({config.intermediate_size}) of {config.architecture} is not divisible by it"
    return None


@dataclass(frozen=True)
class _Heads:
    """This rank's query heads and KV heads (first index and count of each)."""

    q_start: int
    q_count: int
    kv_start: int
    kv_count: int

    @classmethod
    def of(cls, config: ModelConfig, tp: TensorParallel) -> _Heads:
        q = config.num_attention_heads // tp.size
        kv = config.num_key_value_heads
        if tp.size <= kv:
            return cls(tp.rank * q, q, tp.rank * (kv // tp.size), kv // tp.size)
        # More ranks than KV heads: rank r's query heads all read KV head r // (tp / kv).
        return cls(tp.rank * q, q, tp.rank // (tp.size // kv), 1)


class ColumnParallelLinear(nn.Module):
    """``y_r = x W_r^T + b_r``: this rank's output rows of one or more fused projections.

    Args:
        in_features: the input width (whole on every rank).
        pieces: per fused piece (in order) ``(first row, rows)`` of this rank in that piece's
            own HF tensor; the local weight is the pieces' rows stacked.
    """

    def __init__(self, in_features: int, pieces: list[tuple[int, int]], bias: bool) -> None:
        super().__init__()
        self.pieces = pieces
        rows = sum(n for _, n in pieces)
        self.weight = nn.Parameter(torch.empty(rows, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(rows), requires_grad=False) if bias else None

    def shard_weight(self, leaf: str, piece: int, tensor: torch.Tensor) -> torch.Tensor:
        start, rows = self.pieces[piece]
        return tensor.narrow(0, start, rows).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, rows]
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r W_r^T) + b``: this rank's input columns; ``x_r`` is the sharded
    output of the column-parallel layer before it."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.in_local = in_features // tp.size
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def shard_weight(self, leaf: str, piece: int, tensor: torch.Tensor) -> torch.Tensor:
        if leaf == "bias":  # whole on every rank, added once after the sum
            return tensor
        return tensor.narrow(1, self.tp.rank * self.in_local, self.in_local).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in / tp] -> [T, out]
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows ``[rank * V_r, (rank + 1) * V_r)`` of the embedding, ``V_r = padded_vocab / tp``
    (the vocabulary padded to a multiple of ``tp`` with zero rows)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.rows = -(-vocab_size // tp.size)
        self.start = tp.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size), requires_grad=False)

    def shard_weight(self, leaf: str, piece: int, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.new_zeros((self.rows, tensor.shape[1]))
        end = min(self.start + self.rows, self.vocab_size)
        if end > self.start:
            out[: end - self.start] = tensor[self.start : end]
        return out

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """The LM head over the same rows (tied: the embedding's own weight); its forward is the
    full ``[N, vocab_size]`` logits on every rank (gathered, padding trimmed)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        local = F.linear(hidden, self.weight)
        return self.tp.all_gather_last_dim(local)[:, : self.vocab_size]


def shard_decoder(model: DecoderModel, tp: TensorParallel) -> None:
    """Make ``model`` (a Llama-family ``DecoderModel`` built on the meta device, weights not yet
    assigned) rank ``tp.rank``'s shard; the loader then fills it through
    :func:`weight_sharder`.

    Raises:
        ValueError: the architecture or its head counts do not allow ``tp.size``
            (:func:`tensor_parallel_problem`).
    """
    c: ModelConfig = model.config
    problem = tensor_parallel_problem(c, tp.size)
    if problem is not None:
        raise ValueError(problem)
    heads, d, i = _Heads.of(c, tp), c.head_dim, c.intermediate_size // tp.size
    body = model.model
    body.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size, tp)
    model.lm_head = ParallelLMHead(c.vocab_size, c.hidden_size, tp)
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.num_heads, attn.num_kv_heads = heads.q_count, heads.kv_count
        attn.q_size, attn.kv_size = heads.q_count * d, heads.kv_count * d
        kv_piece = (heads.kv_start * d, heads.kv_count * d)
        attn.qkv_proj = ColumnParallelLinear(
            c.hidden_size, [(heads.q_start * d, attn.q_size), kv_piece, kv_piece], bias=c.qkv_bias
        )
        attn.o_proj = RowParallelLinear(c.num_attention_heads * d, c.hidden_size, c.o_proj_bias, tp)
        mlp.gate_up_proj = ColumnParallelLinear(
            c.hidden_size, [(tp.rank * i, i)] * 2, bias=c.mlp_bias
        )
        mlp.down_proj = RowParallelLinear(c.intermediate_size, c.hidden_size, c.mlp_bias, tp)
    model.local_kv_cache_spec = FullAttentionSpec(
        num_layers=c.num_hidden_layers, num_kv_heads=heads.kv_count, head_dim=d
    )
    model.tensor_parallel = tp
    model.tie_weights()


def weight_sharder(
    model: nn.Module,
) -> Callable[[str, int, torch.Tensor], torch.Tensor]:  # (pname, piece index, tensor) -> tensor
    """The loader's hook (``assign_weights(shard=...)``): each HF piece of a parameter cut to
    this rank's part by the parameter's module; the other parameters (norms) are whole."""

    def shard(pname: str, piece: int, tensor: torch.Tensor) -> torch.Tensor:
        module_name, _, leaf = pname.rpartition(".")
        module = model.get_submodule(module_name)
        cut = getattr(module, "shard_weight", None)
        if cut is None:
            return tensor
        piece_tensor: torch.Tensor = cut(leaf, piece, tensor)
        return piece_tensor

    return shard


__all__ = [
    "TENSOR_PARALLEL_ARCHITECTURES",
    "ColumnParallelLinear",
    "ParallelLMHead",
    "RowParallelLinear",
    "TensorParallel",
    "VocabParallelEmbedding",
    "shard_decoder",
    "tensor_parallel_problem",
    "weight_sharder",
]
