"""DESIGN §2 import rules, checked in fresh interpreters (sys.modules after the import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = {
    "oracle": {"torch", "triton", "sqlalchemy", "fastapi", "engine", "kernels", "dashboard",
               "runner_v1", "runner_v2"},
    "oracle.cli": {"torch", "triton", "sqlalchemy", "fastapi"},
    "oracle.client": {"torch", "triton", "sqlalchemy", "fastapi", "starlette", "dashboard",
                      "engine"},
    "dashboard.cli": {"torch", "sqlalchemy", "fastapi", "alembic"},
    "policies": {"torch", "sqlalchemy", "fastapi", "pydantic"},
    "dashboard": {"torch", "triton", "engine", "kernels", "runner_v1", "runner_v2"},
    "engine": {"torch", "sqlalchemy", "fastapi", "dashboard", "runner_v1", "runner_v2"},
    "kernels": {"oracle", "engine", "dashboard", "sqlalchemy", "fastapi", "pydantic",
                "runner_v1", "runner_v2"},
    "runner_v1": {"runner_v2", "dashboard", "sqlalchemy", "fastapi"},
    # The GPU machine has no pydantic: the engine loop and runner_v1 must run without the oracle.
    "engine.core": {"torch", "oracle", "pydantic", "runner_v1", "runner_v2"},
    "runner_v1.model_runner": {"oracle", "pydantic", "runner_v2", "dashboard"},
    "engine.cli": {"torch", "numpy", "oracle"},  # heavy imports stay inside the commands
    "runner_v2": {"runner_v1", "dashboard", "sqlalchemy", "fastapi"},
}


def _loaded_after_import(module: str) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_import_does_not_load_forbidden_packages(module: str) -> None:
    loaded = _loaded_after_import(module)
    assert not (loaded & FORBIDDEN[module]), f"importing {module} loaded {sorted(loaded & FORBIDDEN[module])}"
