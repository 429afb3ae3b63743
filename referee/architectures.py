"""Architectures the generator draws from, and the model facts the harness gives vLLM.

``ARCHITECTURE_POOL`` is every architecture of policies/turnout/families.yaml (the table the
``vllm-*`` packs share). ``SPECIAL_ARCHITECTURES`` are the ones some release's selection names
explicitly (the ROCm V1 default, the breakable-CUDA-graph default, V1-only architectures),
drawn more often so that their rules are exercised. A model's attributes (``is_hybrid``,
``use_mla``, ...) come from the case's spec when it sets them, otherwise from families.yaml:
they are facts about models, not about selection.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

FAMILIES_YAML = Path(__file__).resolve().parent.parent / "policies" / "turnout" / "families.yaml"

SPECIAL_ARCHITECTURES = (
    # vllm/config/vllm.py ROCM_DEFAULT_MRV1_ARCHITECTURES (0.29-0.31)
    "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM",
    "GlmMoeDsaForCausalLM",
    # DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES (0.29-0.33)
    "Dots3NoteForCausalLM",
    "KimiLinearForCausalLM",
    "KimiK3ForConditionalGeneration",
    "MiniMaxM3SparseForCausalLM",
    "Qwen4ExpForCausalLM",
    "DeepseekV41ForCausalLM",
    "InklingForCausalLM",
    "HYV4ForCausalLM",
    "Glm5NextForCausalLM",
    "Step5ForCausalLM",
    "AliceAIForCausalLM",
    "BeamForCausalLM",
    "MuseSpark1xForCausalLM",
    # models whose config hooks change the cache mode (Mamba) or that V1 refuses
    "MambaForCausalLM",
    "Mamba2ForCausalLM",
    "JambaForCausalLM",
    "NemotronHForCausalLM",
    "Step5ForConditionalGeneration",
    # plain ones, so that the special lists are not the only models with a feature
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
)

MODEL_ATTRIBUTES = (
    "is_moe",
    "use_mla",
    "has_inner_state",
    "is_hybrid",
    "attention_free",
    "is_multimodal",
    "is_encoder_decoder",
    "is_diffusion",
    "runner_kind",
    "has_index_topk",
    "supports_mamba_prefix_caching",
)


@cache
def _families() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(FAMILIES_YAML.read_text(encoding="utf-8"))
    out: dict[str, dict[str, Any]] = {}
    for family in data["families"].values():
        shared = family.get("attributes") or {}
        for arch, own in (family.get("architectures") or {}).items():
            out[arch] = {**shared, **(own or {})}
    return out


ARCHITECTURE_POOL: tuple[str, ...] = tuple(sorted(_families()))


def model_facts(spec: dict[str, Any]) -> dict[str, Any]:
    """The model attributes of a spec: its own values first, then families.yaml, then False
    (``runner_kind``: "generate"). An architecture families.yaml lacks gets the defaults."""
    known = _families().get(spec.get("architecture", ""), {})
    out: dict[str, Any] = {}
    for name in MODEL_ATTRIBUTES:
        default = "generate" if name == "runner_kind" else False
        value = spec.get(name)
        out[name] = value if value is not None else known.get(name, default)
    if spec.get("is_pooling") is not None:
        out["runner_kind"] = "pooling" if spec["is_pooling"] else "generate"
    return out
