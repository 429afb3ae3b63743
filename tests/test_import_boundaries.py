"""docs/architecture.md §2 import rules, checked two ways:

- ``lint-imports`` (import-linter, contracts in pyproject.toml ``[tool.importlinter]``) over the
  whole static import graph of the real modules, function-level imports included;
- in fresh interpreters, ``sys.modules`` after importing the real modules (a runner's hub, the
  service app, the CLI), so that lazy imports that only happen at run time are covered too;
- the oracle's own import graph read from its source (oracle.config never reaches
  oracle.sources; no import cycle).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "oracle": {
        "torch",
        "triton",
        "sqlalchemy",
        "fastapi",
        "engine",
        "kernels",
        "dashboard",
        "runner_v1",
        "runner_v2",
    },
    # httpx too: `turnout launch` loads the client only when it runs
    "oracle.cli": {
        "torch",
        "triton",
        "sqlalchemy",
        "fastapi",
        "engine",
        "runner_v1",
        "runner_v2",
        "httpx",
    },
    "oracle.launch": {
        "torch",
        "triton",
        "sqlalchemy",
        "fastapi",
        "starlette",
        "dashboard",
        "engine",
    },
    "oracle.client": {
        "torch",
        "triton",
        "sqlalchemy",
        "fastapi",
        "starlette",
        "dashboard",
        "engine",
    },
    # the wire vocabulary the engine client and the service share: pydantic, no service
    "oracle.wire": {
        "torch",
        "triton",
        "sqlalchemy",
        "fastapi",
        "starlette",
        "dashboard",
        "engine",
        "httpx",
    },
    "dashboard.cli": {"torch", "sqlalchemy", "fastapi", "alembic"},
    "dashboard": {"torch", "triton", "engine", "kernels", "runner_v1", "runner_v2"},
    "dashboard.app": {"torch", "triton", "numpy", "engine", "kernels", "runner_v1", "runner_v2"},
    "policies": {"torch", "sqlalchemy", "fastapi", "pydantic"},
    "engine": {"torch", "sqlalchemy", "fastapi", "dashboard", "runner_v1", "runner_v2"},
    # The manifest type is torch-free; building manifests imports the runners.
    "engine.capabilities": {"torch", "triton", "numpy", "oracle", "runner_v1", "runner_v2"},
    "kernels": {
        "oracle",
        "engine",
        "dashboard",
        "sqlalchemy",
        "fastapi",
        "pydantic",
        "runner_v1",
        "runner_v2",
    },
    "kernels.paged_attention": {
        "oracle",
        "engine",
        "dashboard",
        "pydantic",
        "runner_v1",
        "runner_v2",
    },
    "runner_v1": {"runner_v2", "dashboard", "sqlalchemy", "fastapi", "torch"},
    "runner_v2": {"runner_v1", "dashboard", "sqlalchemy", "fastapi", "torch"},
    # The GPU machine has no pydantic: the engine loop and both runners run without the oracle.
    "engine.core": {"torch", "oracle", "pydantic", "runner_v1", "runner_v2"},
    "engine.runner_setup": {"oracle", "pydantic", "runner_v1", "runner_v2", "dashboard"},
    # tensor parallelism's processes run the runners (on the GPU machine: no pydantic)
    "engine.parallel": {"torch", "oracle", "pydantic", "runner_v1", "runner_v2"},
    "engine.parallel.executor": {"oracle", "pydantic", "runner_v1", "runner_v2", "dashboard"},
    "engine.parallel.worker": {
        "torch",
        "oracle",
        "pydantic",
        "runner_v1",
        "runner_v2",
        "dashboard",
    },
    "runner_v1.model_runner": {"oracle", "pydantic", "runner_v2", "dashboard", "fastapi"},
    "runner_v2.runner": {"oracle", "pydantic", "runner_v1", "dashboard", "fastapi"},
    "engine.llm": {"runner_v1", "runner_v2", "dashboard", "fastapi", "sqlalchemy"},
    "engine.cli": {"torch", "numpy", "oracle"},  # heavy imports stay inside the commands
    # The health recorder is stdlib only; the client it reports through is loaded on demand.
    "engine.health": {"torch", "numpy", "oracle", "pydantic", "httpx"},
    "engine.reporting": {"torch", "numpy", "oracle", "pydantic", "httpx"},
}


@functools.cache
def _loaded_after_import(module: str) -> frozenset[str]:
    # turnout's own packages are named without the ``turnout.`` root (``engine``, ``kernels``),
    # every other module by its top-level name (``torch``); a bare ``kernels`` would be Hugging
    # Face's, which imports as ``kernels`` and never as ``turnout.kernels``.
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module('turnout.' + {module!r})\n"
        "names = {m.split('.')[1] if m.startswith('turnout.') else m.split('.')[0]\n"
        "         for m in sys.modules if m != 'turnout'}\n"
        "print(json.dumps(sorted(names)))\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env
    )
    return frozenset(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_import_does_not_load_forbidden_packages(module: str) -> None:
    loaded = _loaded_after_import(module)
    assert not (loaded & FORBIDDEN[module]), (
        f"importing {module} loaded {sorted(loaded & FORBIDDEN[module])}"
    )


def test_the_real_modules_are_imported() -> None:
    # The hubs above do load their package's heavy dependencies (the check is not vacuous).
    assert {"torch", "engine", "kernels"} <= _loaded_after_import("runner_v2.runner")
    assert {"fastapi", "sqlalchemy", "oracle"} <= _loaded_after_import("dashboard.app")


def _lint_imports() -> list[str]:
    script = Path(sys.executable).with_name("lint-imports")
    found = str(script) if script.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' (import-linter)")
    return [found, "--no-cache", "--config", str(ROOT / "pyproject.toml")]


def test_import_linter_contracts_are_kept() -> None:
    out = subprocess.run(_lint_imports(), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 11 kept, 0 broken." in out.stdout


def test_import_linter_catches_a_runner_importing_the_other(tmp_path: Path) -> None:
    # The same contracts over a copy of the tree where runner_v1 imports runner_v2.
    # The copy is laid out as the wheel installs it (turnout/<package>/), first on PYTHONPATH.
    packages = sorted(p.name for p in (ROOT / "src" / "turnout").iterdir() if p.is_symlink())
    assert {"oracle", "engine", "kernels", "runner_v1", "runner_v2", "serving"} <= set(packages)
    for name in packages:
        shutil.copytree(
            ROOT / name,
            tmp_path / "turnout" / name,
            ignore=shutil.ignore_patterns("*.pyc", "__pycache__"),
        )
    shutil.copy(ROOT / "src" / "turnout" / "__init__.py", tmp_path / "turnout" / "__init__.py")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "turnout" / "runner_v1" / "block_table.py").open("a") as f:
        f.write("\nimport turnout.runner_v2.states  # noqa: E402,F401\n")
    cmd = [*_lint_imports()[:-1], str(tmp_path / "pyproject.toml")]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 1, out.stdout[-2000:]
    assert "runner_v1 and runner_v2 never import each other BROKEN" in out.stdout
    assert "turnout.runner_v1.block_table -> turnout.runner_v2.states" in out.stdout


# -- the oracle's own import graph, read from the source (every import statement, including
# the ones inside functions: a lazy import still closes a circle, it only hides it) ----------

ORACLE_DIR = Path(__file__).resolve().parents[1] / "oracle"


def _oracle_modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ORACLE_DIR.rglob("*.py")):
        parts = ("turnout", *path.relative_to(ORACLE_DIR.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The oracle modules that module ``name`` imports (a package's own __init__ is not
    counted as imported by its submodules)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def _graph() -> dict[str, set[str]]:
    modules = _oracle_modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_graph_reader_sees_lazy_and_package_imports() -> None:
    graph = _graph()
    assert "turnout.oracle.sources.command" in graph["turnout.oracle.sources"]
    assert "turnout.oracle.config" in graph["turnout.oracle.sources.spec"]
    assert "turnout.oracle.yamlpos" in graph["turnout.oracle.sources.command"]  # inside a function
    assert "turnout.oracle" in graph["turnout.oracle.client"]  # from turnout.oracle import ...


def test_config_never_imports_the_sources() -> None:
    graph = _graph()
    assert any(m.startswith("turnout.oracle.sources.") for m in graph), "oracle/sources/ not found"
    reached = _reachable(graph, "turnout.oracle.config")
    assert not {
        m for m in reached if m.startswith(("turnout.oracle.sources.", "turnout.oracle.sources"))
    }
    assert "turnout.oracle" not in reached  # the package __init__ imports the sources


def test_oracle_has_no_import_cycle() -> None:
    graph = _graph()
    cycles = [
        [m, *sorted(m2 for m2 in graph[m] if m in _reachable(graph, m2))]
        for m in sorted(graph)
        if m in _reachable(graph, m)
    ]
    assert not cycles, f"import cycles through: {cycles}"


def test_the_repository_root_is_not_on_sys_path() -> None:
    # make test exports PYTHONSAFEPATH=1 (python -P): the package folders at the root must not
    # import as top-level names, where kernels/ would shadow Hugging Face's `kernels`.
    assert str(ROOT) not in {str(Path(p).resolve()) for p in sys.path if p}, sys.path
    assert "" not in sys.path, "run the suite as make test does: PYTHONSAFEPATH=1 (python -P)"
    spec = importlib.util.find_spec("kernels")
    assert spec is None or Path(str(spec.origin)).resolve() != ROOT / "kernels" / "__init__.py"
