"""policies/known_models.yaml: facts (architecture, quantization) about model ids seen in real
``vllm serve`` command lines, each with its source, for models without a local config.json."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from turnout.oracle.errors import Issue, PackError
from turnout.oracle.fields import FAMILY_ATTRIBUTES, RUNNER_KINDS
from turnout.oracle.pack import load_pack
from turnout.oracle.schema import KnownModel, KnownModels
from turnout.oracle.validate import validate_model
from turnout.oracle.yamlpos import load_with_positions

KNOWN_MODELS_PATH = Path(__file__).resolve().parents[2] / "policies" / "known_models.yaml"


@functools.cache
def load_known_models(path: Path = KNOWN_MODELS_PATH) -> dict[str, KnownModel]:
    """model id -> KnownModel; raises PackError (file:line:column) on a bad file."""
    data, pos = load_with_positions(path)
    models = validate_model(KnownModels, data, pos).models
    issues: list[Issue] = []
    for model_id, entry in models.items():
        for key, value in entry.attributes.items():
            where = ("models", model_id, "attributes", key)
            ok = value in RUNNER_KINDS if key == "runner_kind" else isinstance(value, bool)
            if key not in FAMILY_ATTRIBUTES or not ok:
                issues.append(
                    pos.issue(
                        where,
                        f"bad attribute {key}: {value!r} (expected one "
                        f"of {', '.join(FAMILY_ATTRIBUTES)})",
                    )
                )
    if issues:
        raise PackError(issues)
    return models


def lookup_model(model_id: str) -> KnownModel | None:
    """The entry for ``model_id`` (exact, then case-insensitive), or None."""
    models = load_known_models()
    entry = models.get(model_id)
    if entry is None:
        lowered = {k.lower(): v for k, v in models.items()}
        entry = lowered.get(model_id.lower())
    return entry


def known_model_fields(entry: KnownModel) -> dict[str, Any]:
    return {
        "architecture": entry.architecture,
        "quantization": entry.quantization,
        **entry.attributes,
    }


# Words of architecture names, and sizes and variants of model ids, that say nothing of a family.
_STOP_WORDS = frozenset(
    {
        "for",
        "causal",
        "lm",
        "conditional",
        "generation",
        "model",
        "it",
        "instruct",
        "chat",
        "base",
        "hf",
        "and",
        "the",
        "other",
        "misc",
        "large",
        "small",
        "medium",
        "mini",
        "thinking",
        "reasoning",
        "preview",
        "prev",
        "fp",
        "awq",
        "gptq",
        "int",
        "bf",
        "nvfp",
        "mxfp",
    }
)
MAX_CANDIDATES = 4


def _words(text: str) -> set[str]:
    """Lower-case words and numbers of a model id, label or CamelCase architecture name."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])", " ", text)
    words = set(re.findall(r"[a-z]+|\d+", spaced.lower()))
    return {w for w in words if w not in _STOP_WORDS and (w.isdigit() or len(w) > 1)}


def candidate_architectures(model_id: str, pack_name: str = "turnout") -> list[tuple[str, str]]:
    """(architecture, family label) pairs whose family id, label or architecture name shares
    words with ``model_id``'s name (after the org), best first, at most MAX_CANDIDATES. A guess
    for the reader to check, never used to decide: "arcee-ai/Trinity-Large-Thinking" →
    AfmoeForCausalLM of "AFMoE (Trinity)"."""
    name = _words(model_id.rsplit("/", 1)[-1])
    if not any(not w.isdigit() for w in name):
        return []
    scored = []
    for arch, info in load_pack(pack_name).architectures.items():
        own = name & _words(arch)
        shared = name & (_words(info.family) | _words(info.family_label)) | own
        alpha = sum(not w.isdigit() for w in shared)
        if alpha:
            scored.append(((alpha, len(shared), len(own)), arch, info.family_label))
    if not scored:
        return []
    best = max(score[:2] for score, _, _ in scored)
    top = sorted((s for s in scored if s[0][:2] == best), key=lambda s: (-s[0][2], len(s[1]), s[1]))
    return [(arch, label) for _, arch, label in top][:MAX_CANDIDATES]
