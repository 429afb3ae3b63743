"""HF tensor names of the MoE layers and how each parameter of a ``SparseMoeBlock`` is filled
from them (``engine.model.weights.assign_weights`` runs the recipes).

Checkpoints store experts two ways:

- Qwen2-MoE, Qwen3-MoE, DeepSeek-V2: one tensor per expert and projection,
  ``mlp.experts.{e}.gate_proj/up_proj.weight [I, H]`` and ``down_proj.weight [H, I]``
  (transformers 5 stacks them on load and writes them back per expert on save, its
  ``conversion_mapping.py``), the router ``mlp.gate.weight [E, H]``, shared experts
  ``mlp.shared_expert.*`` (Qwen2-MoE, with ``mlp.shared_expert_gate.weight [1, H]``) or
  ``mlp.shared_experts.*`` (DeepSeek-V2);
- Jamba: the same per-expert names under ``feed_forward.`` (transformers 5's
  ``conversion_mapping.py`` splits its stacked ``experts.gate_up_proj`` back on save), the
  router ``feed_forward.router.weight [E, H]``; our block is ``feed_forward`` too;
- GraniteMoe: already stacked, ``block_sparse_moe.input_linear.weight [E, 2I, H]`` (gate rows
  first), ``output_linear.weight [E, H, I]`` and the router ``router.layer.weight [E, H]``.

A recipe lists ``(index, hf_name)`` pieces: the parameter is allocated once on its device and
each piece copied into ``param[index]``, so the stacked ``w13``/``w2`` never exist twice (one
expert's tensor at a time passes through the host).
"""

from __future__ import annotations

from turnout.engine.model.config import ModelConfig

Index = tuple[int | slice, ...]
#: our parameter name -> the pieces it is assembled from: (index into it, HF name, HF shape)
Recipe = list[tuple[Index, str, tuple[int, ...]]]


def moe_layer_recipes(c: ModelConfig, layer: int) -> dict[str, Recipe]:
    """The recipes of the ``SparseMoeBlock`` parameters of decoder layer ``layer`` (our block is
    ``model.layers.{layer}.mlp``, Jamba's ``model.layers.{layer}.feed_forward``)."""
    moe = c.moe
    assert moe is not None and moe.is_moe_layer(layer)
    ours = f"model.layers.{layer}.mlp."
    h, e_num, i = c.hidden_size, moe.num_experts, moe.moe_intermediate_size
    if moe.family == "granitemoe":
        hf = f"model.layers.{layer}.block_sparse_moe."
        return {
            ours + "gate.weight": [((), hf + "router.layer.weight", (e_num, h))],
            ours + "experts.w13": [((), hf + "input_linear.weight", (e_num, 2 * i, h))],
            ours + "experts.w2": [((), hf + "output_linear.weight", (e_num, h, i))],
        }
    if moe.family == "jamba":  # the block is the layer's feed_forward, its router `router`
        ours = f"model.layers.{layer}.feed_forward."
    hf = ours
    router = hf + ("router.weight" if moe.family == "jamba" else "gate.weight")
    recipes: dict[str, Recipe] = {
        ours + "gate.weight": [((), router, (e_num, h))],
        ours + "experts.w13": [
            piece
            for e in range(e_num)
            for piece in (
                ((e, slice(0, i)), f"{hf}experts.{e}.gate_proj.weight", (i, h)),
                ((e, slice(i, 2 * i)), f"{hf}experts.{e}.up_proj.weight", (i, h)),
            )
        ],
        ours + "experts.w2": [
            ((e,), f"{hf}experts.{e}.down_proj.weight", (h, i)) for e in range(e_num)
        ],
    }
    s = moe.shared_expert_intermediate_size
    if s:
        shared = hf + ("shared_experts." if moe.family == "deepseek_v2" else "shared_expert.")
        recipes[ours + "shared_expert.gate_up_proj.weight"] = [
            ((slice(0, s),), shared + "gate_proj.weight", (s, h)),
            ((slice(s, 2 * s),), shared + "up_proj.weight", (s, h)),
        ]
        recipes[ours + "shared_expert.down_proj.weight"] = [
            ((), shared + "down_proj.weight", (h, s))
        ]
    if moe.shared_expert_gate:
        recipes[ours + "shared_expert_gate.weight"] = [
            ((), hf + "shared_expert_gate.weight", (1, h))
        ]
    return recipes


def moe_weight_recipes(c: ModelConfig) -> dict[str, Recipe]:
    """Recipes of every MoE layer's parameters (empty for a dense model)."""
    if c.moe is None:
        return {}
    out: dict[str, Recipe] = {}
    for layer in range(c.num_hidden_layers):
        if c.moe.is_moe_layer(layer):
            out |= moe_layer_recipes(c, layer)
    return out


def moe_weight_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF names and shapes of every MoE layer's tensors."""
    return {name: shape for recipe in moe_weight_recipes(c).values() for _, name, shape in recipe}


__all__ = ["Index", "Recipe", "moe_layer_recipes", "moe_weight_recipes", "moe_weight_shapes"]
