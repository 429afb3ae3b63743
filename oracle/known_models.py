"""policies/known_models.yaml: facts (architecture, quantization) about model ids seen in real
``vllm serve`` command lines, each with its source, for models without a local config.json."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from oracle.errors import Issue, PackError
from oracle.fields import FAMILY_ATTRIBUTES, RUNNER_KINDS
from oracle.schema import KnownModel, KnownModels
from oracle.validate import validate_model
from oracle.yamlpos import load_with_positions

KNOWN_MODELS_PATH = Path(__file__).resolve().parent.parent / "policies" / "known_models.yaml"


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
                issues.append(pos.issue(where, f"bad attribute {key}: {value!r} (expected one "
                                               f"of {', '.join(FAMILY_ATTRIBUTES)})"))
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
    return {"architecture": entry.architecture, "quantization": entry.quantization,
            **entry.attributes}
