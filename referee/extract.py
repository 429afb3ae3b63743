"""Run named top-level definitions of a release's module without importing the module.

Some modules the selection path reads import vLLM's compiled CUDA ops at import time (which a
CPU machine lacks) although the function the path calls is plain Python.
:func:`release_definitions` reads the installed file, keeps only the named top-level
assignments and functions, and executes exactly that source: the release's own code, without
the imports it does not need.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any


def release_definitions(
    module: str, names: tuple[str, ...], namespace: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``{name: object}`` for ``names`` defined at the top level of ``module``'s file.

    Raises:
        LookupError: the module has no such top-level definition (the release changed it:
            the referee must be updated rather than guess).
    """
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"{module} is not installed")
    source = Path(spec.origin).read_text(encoding="utf-8")
    tree = ast.parse(source)
    kept: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        name = _defined_name(node)
        if name in names:
            kept.append(node)
            found.add(name)
    missing = set(names) - found
    if missing:
        raise LookupError(f"{module} defines none of: {', '.join(sorted(missing))}")
    env: dict[str, Any] = {"__name__": f"referee.extract:{module}", **(namespace or {})}
    exec(compile(ast.Module(body=kept, type_ignores=[]), spec.origin, "exec"), env)
    return {name: env[name] for name in names}


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
    ):
        return node.targets[0].id
    return None
