"""MoEConfig: the mixture-of-experts facts of a config, parsed from its Hugging Face keys.

One frozen value for every MoE family the model layer knows (``MOE_FAMILIES``); the HF keys
differ per family, the facts do not:

- Qwen2-MoE (``Qwen2MoeForCausalLM``, transformers ``qwen2_moe``): ``num_experts``,
  ``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``, one shared expert of
  ``shared_expert_intermediate_size`` behind a sigmoid ``shared_expert_gate``; a layer is sparse
  when it is not in ``mlp_only_layers`` and ``(layer + 1) % decoder_sparse_step == 0``.
- Qwen3-MoE (``qwen3_moe``): the same keys, no shared expert; transformers 5 writes
  ``num_experts`` as ``num_local_experts`` (its ``attribute_map``), and either is read.
- GraniteMoe (``granitemoe``): ``num_local_experts``, ``num_experts_per_tok``, experts of
  ``intermediate_size``; every layer is sparse; the router takes the top-k logits and
  softmaxes them, which equals softmax -> top-k -> renormalise (``norm_topk_prob`` true).
- DeepSeek-V2 (``deepseek_v2``, DeepSeek's ``modeling_deepseek.py`` ``MoEGate``):
  ``n_routed_experts`` (or transformers' alias ``num_experts``), ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``
  (one shared MLP ``n_shared_experts * moe_intermediate_size`` wide, no gate), ``scoring_func``
  (softmax), ``topk_method`` (``greedy`` or ``group_limited_greedy`` with ``n_group`` /
  ``topk_group``), ``routed_scaling_factor``, ``norm_topk_prob``; router logits in float32; a
  layer is sparse when ``layer >= first_k_dense_replace and layer % moe_layer_freq == 0``.
- Jamba (``jamba``, transformers ``JambaSparseMoeBlock`` / ``JambaTopKRouter``): ``num_experts``
  (alias ``num_local_experts``), ``num_experts_per_tok``, experts of ``intermediate_size``;
  softmax over the router logits, top-k, *not* renormalised; a layer is sparse when ``layer %
  expert_layer_period == expert_layer_offset`` (``layers_num_experts``); the router is
  ``feed_forward.router.weight``. transformers' defaults apply to absent keys (16 experts,
  top-2, period 2, offset 1). A Jamba with one expert is dense (``engine.model.mamba_config``).

Imports no torch (``engine.model.config`` holds a ``MoEConfig`` and stays light).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: architecture -> MoE family (the HF ``model_type`` whose tensor names and routing it follows)
MOE_FAMILIES: dict[str, str] = {
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GraniteMoeForCausalLM": "granitemoe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "JambaForCausalLM": "jamba",
}
SCORING_FUNCS = ("softmax",)
TOPK_METHODS = ("greedy", "group_limited_greedy")


@dataclass(frozen=True)
class MoEConfig:
    """The routed and shared experts of a sparse decoder (frozen, hashable).

    ``shared_expert_intermediate_size`` is the width of the one shared MLP every token also
    goes through (0: none); DeepSeek's ``n_shared_experts`` experts are that one MLP,
    ``n_shared_experts * moe_intermediate_size`` wide, as in its checkpoints.
    """

    family: str
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool = False
    scoring_func: str = "softmax"
    topk_method: str = "greedy"
    n_group: int | None = None
    topk_group: int | None = None
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(x @ gate^T) scales the shared expert
    router_in_float32: bool = False  # DeepSeek: router logits from float32 hidden and weights
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    expert_layer_period: int = 1  # Jamba: sparse layers are those with layer % period == offset
    expert_layer_offset: int = 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has the sparse block (else a dense MLP)."""
        return (
            layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
            and layer % self.expert_layer_period == self.expert_layer_offset
        )

    @property
    def renormalize(self) -> bool:
        """Whether the top-k weights are divided by their sum. DeepSeek's gate renormalises
        only for ``top_k > 1`` (``modeling_deepseek.py``: ``if self.top_k > 1 and
        self.norm_topk_prob``)."""
        if self.family == "deepseek_v2":
            return self.norm_topk_prob and self.num_experts_per_tok > 1
        return self.norm_topk_prob

    @property
    def routing_scale(self) -> float:
        """The factor the routed weights are multiplied by. DeepSeek-V2's gate applies
        ``routed_scaling_factor`` only when it does not renormalise (``else: topk_weight =
        topk_weight * self.routed_scaling_factor``); the other families have none. vLLM
        multiplies in both cases and transformers 5 never renormalises: the three agree for
        every released DeepSeek-V2 config (``norm_topk_prob: false``)."""
        if self.family == "deepseek_v2" and not self.renormalize:
            return self.routed_scaling_factor
        return 1.0

    @classmethod
    def from_hf_dict(
        cls, d: Mapping[str, Any], *, architecture: str, num_hidden_layers: int
    ) -> MoEConfig:
        """The MoE facts of ``architecture``'s config ``d`` (see the module docstring).

        Raises:
            ModelConfigError: ``architecture`` is not an MoE family, a required key is missing
                or invalid, or a routing option has no implementation (named in the message).
        """
        family = MOE_FAMILIES.get(architecture)
        if family is None:
            raise _error(
                f"{architecture} has no mixture of experts; MoE families: {', '.join(MOE_FAMILIES)}"
            )
        parse = {
            "qwen2_moe": _qwen_moe,
            "qwen3_moe": _qwen_moe,
            "granitemoe": _granite_moe,
            "deepseek_v2": _deepseek_v2_moe,
            "jamba": _jamba_moe,
        }[family]
        config = cls(family=family, **parse(family, d))
        config._check(num_hidden_layers)
        return config

    def to_hf_dict(self) -> dict[str, Any]:
        """The family's HF keys of these facts (``from_hf_dict`` reads them back)."""
        if self.family == "granitemoe":
            return {
                "num_local_experts": self.num_experts,
                "num_experts_per_tok": self.num_experts_per_tok,
            }
        if self.family == "jamba":
            return {
                "num_experts": self.num_experts,
                "num_experts_per_tok": self.num_experts_per_tok,
                "expert_layer_period": self.expert_layer_period,
                "expert_layer_offset": self.expert_layer_offset,
            }
        common = {
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "norm_topk_prob": self.norm_topk_prob,
        }
        if self.family == "deepseek_v2":
            return {
                **common,
                "n_routed_experts": self.num_experts,
                "n_shared_experts": self.n_shared_experts,
                "scoring_func": self.scoring_func,
                "topk_method": self.topk_method,
                "n_group": self.n_group,
                "topk_group": self.topk_group,
                "routed_scaling_factor": self.routed_scaling_factor,
                "first_k_dense_replace": self.first_k_dense_replace,
                "moe_layer_freq": self.moe_layer_freq,
            }
        out = {
            **common,
            "num_experts": self.num_experts,
            "decoder_sparse_step": self.decoder_sparse_step,
            "mlp_only_layers": list(self.mlp_only_layers),
        }
        if self.family == "qwen2_moe":
            out["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
        return out

    def _check(self, num_hidden_layers: int) -> None:
        if self.num_experts_per_tok > self.num_experts:
            raise _error(
                f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds the "
                f"{self.num_experts} experts"
            )
        bad = [i for i in self.mlp_only_layers if not 0 <= i < num_hidden_layers]
        if bad:
            raise _error(
                f"mlp_only_layers {bad} are not layers of a {num_hidden_layers}-layer model"
            )
        if self.scoring_func not in SCORING_FUNCS:
            raise _error(
                f"scoring_func {self.scoring_func!r} is not implemented; supported: "
                f"{', '.join(SCORING_FUNCS)}"
            )
        if self.topk_method not in TOPK_METHODS:
            raise _error(
                f"topk_method {self.topk_method!r} is not implemented; supported: "
                f"{', '.join(TOPK_METHODS)}"
            )
        if self.topk_method == "group_limited_greedy":
            _check_groups(self.num_experts, self.num_experts_per_tok, self.n_group, self.topk_group)


def _check_groups(
    num_experts: int, top_k: int, n_group: int | None, topk_group: int | None
) -> None:
    if not n_group or not topk_group:
        raise _error("topk_method 'group_limited_greedy' needs n_group and topk_group")
    if num_experts % n_group:
        raise _error(f"n_group ({n_group}) must divide the {num_experts} experts")
    if not 0 < topk_group <= n_group:
        raise _error(f"topk_group ({topk_group}) must be in [1, n_group={n_group}]")
    if top_k > topk_group * (num_experts // n_group):
        raise _error(
            f"num_experts_per_tok ({top_k}) exceeds the experts of {topk_group} groups "
            f"of {num_experts // n_group}"
        )


def _qwen_moe(family: str, d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(
        num_experts=_positive_aliased(
            d, "num_experts", "num_local_experts" if family == "qwen3_moe" else None
        ),
        num_experts_per_tok=_positive(d, "num_experts_per_tok"),
        moe_intermediate_size=_positive(d, "moe_intermediate_size"),
        norm_topk_prob=_flag(d, "norm_topk_prob", False),
        decoder_sparse_step=_positive(d, "decoder_sparse_step", 1),
        mlp_only_layers=_layer_list(d, "mlp_only_layers"),
    )
    if family == "qwen2_moe":
        out |= dict(
            n_shared_experts=1,
            shared_expert_gate=True,
            shared_expert_intermediate_size=_positive(d, "shared_expert_intermediate_size"),
        )
    return out


def _granite_moe(family: str, d: Mapping[str, Any]) -> dict[str, Any]:
    return dict(
        num_experts=_positive(d, "num_local_experts"),
        num_experts_per_tok=_positive(d, "num_experts_per_tok"),
        moe_intermediate_size=_positive(d, "intermediate_size"),
        norm_topk_prob=True,  # softmax over the top-k logits
    )


def _jamba_moe(family: str, d: Mapping[str, Any]) -> dict[str, Any]:
    period = _positive(d, "expert_layer_period", 2)
    offset = _non_negative(d, "expert_layer_offset", 1)
    if offset >= period:
        raise _error(
            f"expert_layer_offset ({offset}) must be smaller than expert_layer_period ({period})"
        )
    return dict(
        num_experts=jamba_num_experts(d),
        num_experts_per_tok=_positive(d, "num_experts_per_tok", 2),
        moe_intermediate_size=_positive(d, "intermediate_size"),
        norm_topk_prob=False,  # JambaTopKRouter: the top-k softmax weights as they are
        expert_layer_period=period,
        expert_layer_offset=offset,
    )


def jamba_num_experts(d: Mapping[str, Any]) -> int:
    """Jamba's ``num_experts`` (or its alias ``num_local_experts``; transformers' default 16).

    Raises:
        ModelConfigError: not a positive integer, or the two keys disagree.
    """
    if d.get("num_experts") is None and d.get("num_local_experts") is None:
        return 16
    return _positive_aliased(d, "num_experts", "num_local_experts")


def _deepseek_v2_moe(family: str, d: Mapping[str, Any]) -> dict[str, Any]:
    inter = _positive(d, "moe_intermediate_size")
    if d.get("mlp_bias"):  # transformers gives DeepSeek's shared experts mlp_bias; ours have none
        raise _error(
            "mlp_bias is not supported for DeepSeek-V2's MoE block (shared experts without bias)"
        )
    n_shared = _non_negative(d, "n_shared_experts", 0)
    scale = d.get("routed_scaling_factor", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
        raise _error(
            f"config field `routed_scaling_factor` must be a positive number, got {scale!r}"
        )
    return dict(
        num_experts=_positive_aliased(d, "n_routed_experts", "num_experts"),
        num_experts_per_tok=_positive(d, "num_experts_per_tok"),
        moe_intermediate_size=inter,
        norm_topk_prob=_flag(d, "norm_topk_prob", False),
        scoring_func=str(d.get("scoring_func") or "softmax"),
        topk_method=str(d.get("topk_method") or "greedy"),
        n_group=_optional_positive(d, "n_group"),
        topk_group=_optional_positive(d, "topk_group"),
        routed_scaling_factor=float(scale),
        n_shared_experts=n_shared,
        shared_expert_intermediate_size=n_shared * inter,
        router_in_float32=True,
        first_k_dense_replace=_non_negative(d, "first_k_dense_replace", 0),
        moe_layer_freq=_positive(d, "moe_layer_freq", 1),
    )


def _int(d: Mapping[str, Any], key: str, default: int | None) -> int:
    value = d.get(key, default)
    if value is None:
        raise _error(f"config field `{key}` is required")
    if not isinstance(value, int) or isinstance(value, bool):
        raise _error(f"config field `{key}` must be an integer, got {value!r}")
    return value


def _positive(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = _int(d, key, default)
    if value <= 0:
        raise _error(f"config field `{key}` must be a positive integer, got {value!r}")
    return value


def _positive_aliased(d: Mapping[str, Any], key: str, alias: str | None) -> int:
    # transformers' attribute_map lets a config carry a field under a second name
    if alias is None or d.get(alias) is None:
        return _positive(d, key)
    if d.get(key) is None:
        return _positive(d, alias)
    if d[key] != d[alias]:
        raise _error(f"config fields `{key}` ({d[key]!r}) and `{alias}` ({d[alias]!r}) disagree")
    return _positive(d, key)


def _non_negative(d: Mapping[str, Any], key: str, default: int) -> int:
    value = _int(d, key, default) if d.get(key) is not None else default
    if value < 0:
        raise _error(f"config field `{key}` must be >= 0, got {value!r}")
    return value


def _optional_positive(d: Mapping[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else _positive(d, key)


def _flag(d: Mapping[str, Any], key: str, default: bool) -> bool:
    value = d.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _error(f"config field `{key}` must be true or false, got {value!r}")
    return value


def _layer_list(d: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = d.get(key) or []
    if not isinstance(value, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        raise _error(f"config field `{key}` must be a list of layer indices, got {value!r}")
    return tuple(sorted(set(value)))


def _error(message: str) -> ValueError:
    # engine.model.config imports this module: its error class is looked up when raised.
    from turnout.engine.model.config import ModelConfigError

    return ModelConfigError(message)


__all__ = ["MOE_FAMILIES", "SCORING_FUNCS", "TOPK_METHODS", "MoEConfig", "jamba_num_experts"]
