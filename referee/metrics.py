"""vLLM's Prometheus metric table, read from a release's own source: every metric its engine
stat logger registers (``vllm/v1/metrics/loggers.py``, class ``PrometheusStatLogger``), with its
type, help text, label names and histogram buckets.

The logger is not instantiated (it needs a whole ``VllmConfig`` and a model): its source is
parsed instead, and each ``self._gauge_cls`` / ``self._counter_cls`` / ``self._histogram_cls``
call is read for its literal ``name``, ``documentation``, ``labelnames`` and ``buckets``. The
bucket variables come from ``histogram_buckets("<family>", ...)`` calls of the same file, whose
default values are computed by the release's own ``vllm/v1/metrics/buckets.py``, loaded on its
own (it imports only the standard library). The ``request_tokens`` family depends on
``max_model_len`` (a 1-2-5 series up to it): it is written as the rule, not as values.

Written to ``policies/reference/vllm-<release>/metrics.json`` by ``python -m referee metrics``
(``make referee``); ``turnout.serving.metrics`` exports these names and
tests/serving/test_metrics_names.py holds the server's ``/metrics`` to the table.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

LOGGERS = "v1/metrics/loggers.py"
BUCKETS = "v1/metrics/buckets.py"
_KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
# The label names every per-engine metric is registered with (``labelnames = [...]`` in the
# logger's __init__); read from the source, this only names the variable.
_BASE_LABELS_VAR = "labelnames"
#: The buckets of the ``request_tokens`` histograms: vLLM computes them from max_model_len.
REQUEST_TOKENS_RULE = {"rule": "1-2-5 series up to max_model_len"}


def vllm_source() -> Path:
    """The installed ``vllm`` package folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("referee metrics: vllm is not installed here (pass --source)")
    return Path(next(iter(spec.submodule_search_locations)))


def source_version(source: Path) -> str:
    """The release of a vllm package folder, from its ``_version.py`` (no import)."""
    text = (source / "_version.py").read_text(encoding="utf-8")
    found = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
    if found is None:
        raise SystemExit(f"referee metrics: no __version__ in {source / '_version.py'}")
    return found.group(1)


def _bucket_defaults(source: Path) -> Any:
    spec = importlib.util.spec_from_file_location("_vllm_metric_buckets", source / BUCKETS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _literal(node: ast.AST, names: dict[str, Any]) -> Any:
    """A call argument's value: a constant, a list of constants, a concatenation, or a name
    bound earlier to one of those (``labelnames``, a bucket variable)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name | ast.Attribute):
        return names.get(ast.unparse(node), {"unresolved": ast.unparse(node)})
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e, names) for e in node.elts]
    if (  # before buckets.py (0.29): a request_tokens histogram's buckets, computed at start
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "build_1_2_5_buckets"
    ):
        return dict(REQUEST_TOKENS_RULE)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, names), _literal(node.right, names)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(left, list) and isinstance(right, list):
            return left + right
    return {"unresolved": ast.unparse(node)}


def metric_table(source: Path) -> dict[str, Any]:
    """The logger's metrics, in registration order, each with its source line.

    Releases before 0.30 have no ``buckets.py``: their buckets are literal lists in the
    logger (bound to a variable, or given inline), read as written.

    Raises:
        FileNotFoundError: ``source`` is not a vllm package folder of a release with
            ``vllm/v1/metrics/loggers.py``.
    """
    buckets = _bucket_defaults(source) if (source / BUCKETS).exists() else None
    tree = ast.parse((source / LOGGERS).read_text(encoding="utf-8"), filename=LOGGERS)
    logger = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "PrometheusStatLogger"
    )
    names: dict[str, Any] = {}
    families: dict[str, Any] = {}
    metrics: list[dict[str, Any]] = []
    for node in ast.walk(logger):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and target.id == _BASE_LABELS_VAR:
                names[target.id] = _literal(value, names)
            elif (  # self.labelname_max_lora = "max_lora": label names of the LoRA info gauge
                isinstance(target, ast.Attribute)
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
            ):
                names[ast.unparse(target)] = value.value
            elif (  # request_latency_buckets = [0.3, 0.5, ...] (0.29)
                isinstance(target, ast.Name)
                and isinstance(value, ast.List)
                and value.elts
                and all(
                    isinstance(e, ast.Constant) and type(e.value) in (int, float)
                    for e in value.elts
                )
            ):
                names[target.id] = [float(e.value) for e in value.elts]  # type: ignore[attr-defined]
            elif (
                buckets is not None
                and isinstance(target, ast.Name)
                and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "histogram_buckets"
                and value.args
                and isinstance(value.args[0], ast.Constant)
            ):
                family = str(value.args[0].value)
                if family == "request_tokens":
                    families[family] = dict(REQUEST_TOKENS_RULE)
                else:
                    families[family] = [float(b) for b in buckets.histogram_buckets(family)]
                names[target.id] = {"family": family}
    for node in sorted(
        (n for n in ast.walk(logger) if isinstance(n, ast.Call)), key=lambda n: n.lineno
    ):
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in _KINDS):
            continue
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        name = _literal(kwargs["name"], names) if "name" in kwargs else None
        if not isinstance(name, str):
            continue  # the info gauges: their names are chosen at run time
        entry: dict[str, Any] = {
            "name": name,
            "type": _KINDS[func.attr],
            "documentation": _literal(kwargs["documentation"], names)
            if "documentation" in kwargs
            else "",
            "labelnames": _literal(kwargs["labelnames"], names) if "labelnames" in kwargs else [],
            "line": node.lineno,
        }
        if "buckets" in kwargs:
            entry["buckets"] = _literal(kwargs["buckets"], names)
        metrics.append(entry)
    return {
        "source": f"vllm/{LOGGERS} (PrometheusStatLogger)"
        + (f", vllm/{BUCKETS}" if buckets is not None else ""),
        "vllm_version": source_version(source),
        "bucket_families": families,
        "metrics": metrics,
    }


def dumps(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=False) + "\n"
