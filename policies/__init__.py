"""Policy packs (data only): one folder per pack, plus ``reference/``, the public data the packs
are checked against (real vLLM command lines, vLLM 0.31.0's own decisions, HF configs)."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable


def pack_dir(name: str) -> Traversable:
    """The folder of the shipped pack ``name`` (e.g. ``"turnout"``, ``"vllm-0.31"``)."""
    return files(__name__).joinpath(name)


def reference_dir() -> Traversable:
    """The folder of the shipped reference data (``vllm_recipes.jsonl``, ``model_configs/``)."""
    return files(__name__).joinpath("reference")
