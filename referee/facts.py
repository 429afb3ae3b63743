"""Model facts as a release's own source states them, read without importing a model.

``vllm/model_executor/models/registry.py`` maps each architecture to the module and class that
implement it; the class's bases name the interfaces it implements (``IsHybrid``,
``HasInnerState``, ``IsAttentionFree``, ``SupportsMultiModal``, ``SupportsMambaPrefixCaching``,
``MixtureOfExperts``), directly or through a parent class. Both are read with ``ast`` from the
installed files, so no CUDA kernel is loaded. ``python -m referee facts ARCH ...`` prints the
attributes families.yaml should hold for them (its ``source`` names the release).
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

INTERFACES = {
    "IsHybrid": "is_hybrid",
    "HasInnerState": "has_inner_state",
    "IsAttentionFree": "attention_free",
    "SupportsMultiModal": "is_multimodal",
    "SupportsMambaPrefixCaching": "supports_mamba_prefix_caching",
    "MixtureOfExperts": "is_moe",
}
_POOLING_TABLES = ("_EMBEDDING_MODELS", "_CROSS_ENCODER_MODELS")


def _models_dir() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "model_executor" / "models"


@cache
def registry() -> dict[str, tuple[str, str, str]]:
    """architecture -> (registry table, module, class) of the installed release; an
    architecture in a generation table and a pooling table counts as generation."""
    tree = ast.parse((_models_dir() / "registry.py").read_text(encoding="utf-8"))
    out: dict[str, tuple[str, str, str]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Dict):
            continue
        for k, v in zip(value.keys, value.values, strict=True):
            if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and len(v.elts) >= 2:
                mod, cls = (e.value if isinstance(e, ast.Constant) else "" for e in v.elts[:2])
                arch = str(k.value)
                if arch not in out or out[arch][0] in _POOLING_TABLES:
                    out[arch] = (target.id, str(mod), str(cls))
    return out


@cache
def _class_bases() -> dict[str, set[str]]:
    bases: dict[str, set[str]] = {}
    for path in _models_dir().glob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases
                )
    return bases


def _interfaces(cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
    found: set[str] = set()
    for base in _class_bases().get(cls, set()):
        if base in INTERFACES:
            found.add(base)
        elif base not in seen:
            found |= _interfaces(base, seen | {cls})
    return found


def facts(architecture: str) -> dict[str, Any] | None:
    """The attributes of ``architecture`` in the installed release (None: not registered)."""
    entry = registry().get(architecture)
    if entry is None:
        return None
    table, _, cls = entry
    out: dict[str, Any] = {INTERFACES[i]: True for i in _interfaces(cls)}
    if table == "_MULTIMODAL_MODELS":
        out["is_multimodal"] = True
    if table in _POOLING_TABLES:
        out["runner_kind"] = "pooling"
    return out
